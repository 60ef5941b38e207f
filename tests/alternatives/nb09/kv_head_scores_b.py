# A loop over KV heads, each taking the max of its query heads' columns h*G .. h*G+G-1, stacked along dim 1.
import torch


def kv_head_scores(scores, kv_heads):
    group = scores.shape[1] // kv_heads
    columns = []
    for h in range(kv_heads):
        columns.append(scores[:, h * group : (h + 1) * group].max(dim=1).values)
    return torch.stack(columns, dim=1)
