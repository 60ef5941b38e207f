# A mask of the target positions; the loss summed over them and divided by their count.
import torch
import torch.nn.functional as F


def lm_loss(logits, inputs, n_prefix):
    b, n, v = logits.shape
    per_token = F.cross_entropy(logits[:, :-1].reshape(-1, v), inputs[:, 1:].reshape(-1), reduction="none")
    is_target = (torch.arange(1, n) >= max(n_prefix, 1)).repeat(b)
    return per_token[is_target].sum() / is_target.sum()
