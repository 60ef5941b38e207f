# Sinks and the recent window kept apart: the window is cut to its last `window` tokens after every append.
import torch

from course.rope import rope


def rolling_step(state, q, k, v, t, n_sink, window, theta):
    if state is None:
        empty = k[:, :, :0]
        state = {"sink": (empty, empty), "recent": (empty, empty)}
    part = "sink" if t < n_sink else "recent"
    old_k, old_v = state[part]
    new_k, new_v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
    if part == "recent":
        new_k, new_v = new_k[:, :, -window:], new_v[:, :, -window:]
    state[part] = (new_k, new_v)
    keys = torch.cat([state["sink"][0], state["recent"][0]], dim=2)
    values = torch.cat([state["sink"][1], state["recent"][1]], dim=2)
    b, hkv, n, d = keys.shape
    h = q.shape[1]
    ranks = torch.arange(n).unsqueeze(0).expand(b, n)
    keys = rope(keys, ranks, theta).repeat_interleave(h // hkv, dim=1)
    values = values.repeat_interleave(h // hkv, dim=1)
    query = rope(q, ranks[:, -1:], theta)
    scores = torch.einsum("bhqd,bhkd->bhqk", query, keys) / d**0.5
    return torch.einsum("bhqk,bhkd->bhqd", scores.softmax(dim=-1), values), state
