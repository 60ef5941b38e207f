# Per KV head in Python: the group's mean votes, the best prefix positions, the window, then sorted().
import torch


def snapkv_keep(votes, capacity, window, kv_heads):
    h, p = votes.shape
    g = h // kv_heads
    rows = []
    for kv in range(kv_heads):
        mean = votes[kv * g:(kv + 1) * g].mean(dim=0)
        best = torch.argsort(mean, descending=True)[: capacity - window].tolist()
        rows.append(sorted(best + list(range(p, p + window))))
    return torch.tensor(rows, dtype=torch.long)
