# Vectorised: sort each head, keep its safeguard best, one topk over the flattened rest, bincount per head.
import torch


def adakv_counts(scores, budget, safeguard):
    kv_heads, slots = scores.shape
    keep = min(slots, max(1, int(budget * safeguard)))
    ordered = scores.sort(dim=-1, descending=True).values
    rest = ordered[:, keep:]                                 # [H_kv, S - keep]
    shared = kv_heads * budget - kv_heads * keep
    counts = torch.full((kv_heads,), keep, dtype=torch.long)
    if shared > 0:
        winners = rest.flatten().topk(shared).indices // rest.shape[1]
        counts += torch.bincount(winners, minlength=kv_heads)
    return counts
