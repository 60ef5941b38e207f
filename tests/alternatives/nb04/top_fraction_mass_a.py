# Sort each row in descending order and add up its first k weights.
import math

import torch


def top_fraction_mass(weights, fraction):
    s = weights.shape[-1]
    k = max(1, math.ceil(fraction * s))
    ordered = torch.sort(weights, dim=-1, descending=True).values
    return ordered[..., :k].sum(dim=-1)
