# Votes, pooling and the group mean written inline; the window's slots first, then the best prefix slots.
import torch
import torch.nn.functional as F


def snapkv_select(attn, capacity, kernel, pooling, kv_heads):
    h, w, s = attn.shape
    votes = attn[:, :, : s - w].sum(dim=1, keepdim=True)                   # [H, 1, S - w]
    if pooling == "max":
        votes = F.max_pool1d(votes, kernel, stride=1, padding=kernel // 2)
    else:
        votes = F.avg_pool1d(votes, kernel, stride=1, padding=kernel // 2, count_include_pad=False)
    group = votes[:, 0].view(kv_heads, h // kv_heads, s - w).mean(dim=1)   # [kv_heads, S - w]
    best = group.argsort(dim=-1, descending=True)[:, : capacity - w]
    window = torch.arange(s - w, s).repeat(kv_heads, 1)
    return torch.cat([window, best], dim=1)
