# unfold over padded rows: -inf padding for max, and for avg a sum divided by the count of real positions.
import torch
import torch.nn.functional as F


def pool_votes(votes, kernel, kind="max"):
    r = kernel // 2
    if kind == "max":
        windows = F.pad(votes, (r, r), value=float("-inf")).unfold(-1, kernel, 1)
        return windows.max(dim=-1).values
    sums = F.pad(votes, (r, r)).unfold(-1, kernel, 1).sum(dim=-1)
    counts = F.pad(torch.ones_like(votes), (r, r)).unfold(-1, kernel, 1).sum(dim=-1)
    return sums / counts
