# Back to scores: log of the weights, dropped keys set to -inf, softmax again (in float64, cast back).
import math

import torch


def renormalise_without(weights, keep):
    scores = weights.double().log().masked_fill(~keep.bool(), -math.inf)
    return torch.softmax(scores, dim=-1).to(weights.dtype)
