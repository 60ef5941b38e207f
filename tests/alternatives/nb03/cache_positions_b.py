# Sort once, then write the ranks 0..n-1 back to the slots the sorted order came from.
import torch


def cache_positions(original):
    order = torch.sort(original).indices
    ranks = torch.empty_like(original)
    ranks[order] = torch.arange(len(original), dtype=original.dtype)
    return ranks
