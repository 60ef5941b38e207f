# The cache as a Python list in token order: append, drop the oldest recent entry when over capacity; in token
# order a cached token's rank is its index, so no argsort is needed.
import math

import torch

from course.rope import rope


def rolling_step(state, q, k, v, t, n_sink, window, theta):
    if state is None:
        state = []
    state.append((k, v))
    if len(state) > n_sink + window:
        del state[n_sink]                       # the oldest token after the sinks
    keys = torch.cat([kk for kk, _ in state], dim=2)
    values = torch.cat([vv for _, vv in state], dim=2)
    b, hkv, n, d = keys.shape
    g = q.shape[1] // hkv
    keys = rope(keys, torch.arange(n).expand(b, n), theta).repeat_interleave(g, dim=1)
    query = rope(q, torch.full((b, 1), n - 1), theta)
    weights = torch.softmax(query @ keys.transpose(-1, -2) / math.sqrt(d), dim=-1)
    return weights @ values.repeat_interleave(g, dim=1), state
