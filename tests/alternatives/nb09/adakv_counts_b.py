# Marks each head's safeguard slots by pushing them to +inf in a float64 copy, then one global ranking (a stable
# argsort) over every slot of the layer; counts per head with a Python loop.
import torch


def adakv_counts(scores, budget, safeguard):
    h, s = scores.shape
    guard = max(1, int(budget * safeguard))
    boosted = scores.double().clone()
    best = boosted.topk(guard, dim=-1).indices
    boosted.scatter_(1, best, float("inf"))
    order = torch.argsort(boosted.flatten(), descending=True, stable=True)[: h * budget]
    counts = [0] * h
    for flat in order.tolist():
        counts[flat // s] += 1
    return torch.tensor(counts)
