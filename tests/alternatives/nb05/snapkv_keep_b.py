# A boolean mask of the kept prefix positions per KV head, read back with nonzero (already in order).
import torch


def snapkv_keep(votes, capacity, window, kv_heads):
    h, p = votes.shape
    mean = votes.view(kv_heads, h // kv_heads, p).sum(1) / (h // kv_heads)
    keep = torch.zeros(kv_heads, p + window, dtype=torch.bool)
    keep.scatter_(1, mean.topk(capacity - window, dim=-1).indices, True)
    keep[:, p:] = True
    return keep.nonzero()[:, 1].view(kv_heads, capacity)
