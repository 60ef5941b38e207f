# Two stages, as the text says: each head's safeguard first, then the layer's remaining slots by one top-k
# over the slots not yet kept (the safeguarded ones masked out with -inf).
import torch


def adakv_counts(scores, budget, safeguard):
    h, s = scores.shape
    safe = max(1, int(budget * safeguard))
    mine = scores.topk(safe, dim=1).indices
    left = scores.clone().scatter_(1, mine, float("-inf"))
    shared = left.reshape(-1).topk(h * budget - h * safe).indices // s
    return torch.full((h,), safe, dtype=torch.long) + torch.bincount(shared, minlength=h)
