# Read the running total of the descending weights at the k-th key.
import math


def top_fraction_mass(weights, fraction):
    k = max(1, math.ceil(fraction * weights.size(-1)))
    running = weights.sort(dim=-1, descending=True).values.cumsum(dim=-1)
    return running[..., k - 1]
