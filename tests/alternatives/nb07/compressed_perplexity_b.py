# Collects every step's logits first, then one cross-entropy over all of them in float64 (a sum, divided by the
# count); the prompt's logits are not kept (logits_to_keep=1).
import math

import torch
import torch.nn.functional as F

from course.compression import compress_prompt


def compressed_perplexity(model, ids, context, policy):
    with torch.inference_mode():
        prompt = ids[:, : context - 1]
        cache, _ = compress_prompt(model, prompt, policy, logits_to_keep=1)
        feed = ids[:, context - 1 : -1].to(model.device)
        targets = ids[:, context:].to(model.device)
        steps = [model(feed[:, t].unsqueeze(1), cache=cache).logits[:, -1] for t in range(feed.shape[1])]
        logits = torch.stack(steps, dim=1).double()           # [B, N, V]
        total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
        return math.exp(total.item() / targets.numel())
