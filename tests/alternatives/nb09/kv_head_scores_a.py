# A loop over the KV heads: the largest score in each group of neighbouring query heads.
import torch


def kv_head_scores(scores, kv_heads):
    g = scores.shape[1] // kv_heads
    return torch.stack([scores[:, j * g:(j + 1) * g].max(dim=1).values for j in range(kv_heads)], dim=1)
