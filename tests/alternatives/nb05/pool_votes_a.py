# A loop over positions: the window [i - r, i + r] clipped to the row, max or mean over what it covers.
import torch


def pool_votes(votes, kernel, kind="max"):
    r = kernel // 2
    s = votes.shape[-1]
    out = torch.empty_like(votes)
    for i in range(s):
        part = votes[:, max(0, i - r): min(s, i + r + 1)]
        out[:, i] = part.amax(dim=-1) if kind == "max" else part.mean(dim=-1)
    return out
