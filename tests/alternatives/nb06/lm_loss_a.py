# Log-softmax and gather by hand, averaged over every target of the batch.
import torch


def lm_loss(logits, inputs, n_prefix):
    first = 1 if n_prefix == 0 else n_prefix
    logp = torch.log_softmax(logits[:, first - 1:-1].double(), dim=-1)
    targets = inputs[:, first:]
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return -picked.mean().to(logits.dtype)
