# The candidate slots first, then the one with the lowest score among them.
import torch


def h2o_victim(scores, positions, seen, recent, n_sink=0):
    candidates = torch.nonzero((positions >= n_sink) & (positions < seen - recent)).flatten()
    return candidates[scores[candidates].argmin()].item()
