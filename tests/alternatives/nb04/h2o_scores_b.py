# masked_fill for the recent window; the mean rule divides by how many queries saw each slot.
import torch


def h2o_scores(acc, positions, seen, recent, mean=False):
    seen_by = torch.maximum(seen - positions, torch.ones_like(positions))
    score = acc / seen_by if mean else acc
    return score.masked_fill(positions >= seen - recent, float("inf"))
