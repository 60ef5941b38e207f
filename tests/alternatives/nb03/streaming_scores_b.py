# Age instead of position: the oldest has the largest age, so the score is minus the age; sinks pinned.
import torch


def streaming_scores(positions, seen, n_sink):
    age = (seen - positions).float()
    return torch.where(positions < n_sink, torch.full_like(age, float("inf")), -age)
