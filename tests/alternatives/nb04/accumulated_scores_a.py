# One KV head at a time: its query heads' column sums, averaged.
import torch


def accumulated_scores(attn, kv_heads):
    group = attn.shape[0] // kv_heads
    rows = []
    for h in range(kv_heads):
        received = attn[h * group : (h + 1) * group].sum(dim=1)   # [group, T]
        rows.append(received.mean(dim=0))
    return torch.stack(rows)
