# One KV head at a time, pooling by hand over the clipped neighbourhood of each prefix slot.
import torch


def snapkv_select(attn, capacity, kernel, pooling, kv_heads):
    h, w, s = attn.shape
    p, r, g = s - w, kernel // 2, h // kv_heads
    votes = attn[:, :, :p].sum(dim=1)                                       # [H, P]
    pooled = torch.stack([
        votes[:, max(0, i - r): i + r + 1].amax(-1) if pooling == "max" else votes[:, max(0, i - r): i + r + 1].mean(-1)
        for i in range(p)], dim=1)                                          # [H, P]
    rows = []
    for kv in range(kv_heads):
        score = pooled[kv * g:(kv + 1) * g].mean(dim=0)
        best = torch.topk(score, capacity - w).indices
        rows.append(torch.cat([best.sort().values, torch.arange(p, s)]))
    return torch.stack(rows)
