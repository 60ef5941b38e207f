# Token-by-token loop, log-softmax in float32 and gather; the NLLs averaged in float64 before exp.
import math

import torch

from course.compression import compress_prompt


@torch.inference_mode()
def compressed_perplexity(model, ids, context, policy):
    ids = ids.to(model.device)
    cache, _ = compress_prompt(model, ids[:, : context - 1], policy)
    nlls = []
    for i in range(context - 1, ids.shape[1] - 1):
        logits = model(ids[:, i : i + 1], cache=cache).logits[:, -1].float()
        logp = torch.log_softmax(logits, dim=-1)
        nlls.append(-logp.gather(-1, ids[:, i + 1 : i + 2])[:, 0])
    nll = torch.stack(nlls, dim=1)   # [B, T - context]
    return math.exp(nll.double().mean().item())
