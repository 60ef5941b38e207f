# Vectorised: torch.cat to grow the cache, then one softmax over the scores, in the inputs' dtype.
import math

import torch


def attention_step(q, k_new, v_new, K, V):
    """q, k_new, v_new: [d]; K, V: [t, d]. Returns (output [d], K [t+1, d], V [t+1, d])."""
    K = torch.cat([K, k_new[None, :]], dim=0)
    V = torch.cat([V, v_new.unsqueeze(0)], dim=0)
    scores = K @ q / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores, dim=-1)
    return weights @ V, K, V
