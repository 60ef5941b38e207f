# A loop over heads and queries, accumulated in float64, returned in the input's dtype.
import torch


def sink_mass_per_head(attn, k=1, skip=4):
    """attn: [H, T, T] -> [H]"""
    heads, T, _ = attn.shape
    out = torch.zeros(heads, dtype=torch.float64, device=attn.device)
    for h in range(heads):
        total = 0.0
        for i in range(skip, T):
            total += float(attn[h, i, :k].double().sum())
        out[h] = total / (T - skip)
    return out.to(attn.dtype)
