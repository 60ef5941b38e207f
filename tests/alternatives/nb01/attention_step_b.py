# A Python loop over the cached rows with a max-subtracted exp, accumulated in float64 and cast back at the end;
# the cache grows with torch.vstack.
import math

import torch


def _dot(a, b):
    return float((a.double() * b.double()).sum())


def attention_step(q, k_new, v_new, K, V):
    """q, k_new, v_new: [d]; K, V: [t, d]. Returns (output [d], K [t+1, d], V [t+1, d])."""
    K_new = torch.vstack([K, k_new.reshape(1, -1)])
    V_new = torch.vstack([V, v_new.reshape(1, -1)])
    d = q.numel()
    scores = [_dot(q, K_new[j]) / math.sqrt(d) for j in range(K_new.shape[0])]
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    out = torch.zeros(d, dtype=torch.float64, device=q.device)
    for e, v in zip(exps, V_new):
        out += (e / total) * v.double()
    return out.to(q.dtype), K_new, V_new
