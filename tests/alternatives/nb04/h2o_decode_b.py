# Until the cache is full the new token is appended; from then on it overwrites the victim's slot in place
# (scatter) instead of removing it and appending; the keys are rotated at their own positions at every step.
import math

import torch

from course.rope import rope


def h2o_step(state, q, k, v, t, budget, recent, theta):
    b, hkv, _, d = k.shape
    g = q.shape[1] // hkv
    if state is None or state["pos"].shape[-1] < budget:                     # still filling: append
        if state is None:
            state = {"k": k[:, :, :0], "v": v[:, :, :0], "pos": torch.zeros(b, hkv, 0, dtype=torch.long),
                     "score": k.new_zeros(b, hkv, 0)}
        state = {"k": torch.cat([state["k"], k], 2), "v": torch.cat([state["v"], v], 2),
                 "pos": torch.cat([state["pos"], torch.full((b, hkv, 1), t)], 2),
                 "score": torch.cat([state["score"], k.new_zeros(b, hkv, 1)], 2)}
    else:                                                                    # full: overwrite the victim's slot
        rank = state["score"].masked_fill(state["pos"] >= t - recent, math.inf)
        slot = rank.argmin(dim=-1, keepdim=True)                              # [B, H_kv, 1]
        state["k"].scatter_(2, slot[..., None].expand(b, hkv, 1, d), k)
        state["v"].scatter_(2, slot[..., None].expand(b, hkv, 1, d), v)
        state["pos"].scatter_(2, slot, t)
        state["score"].scatter_(2, slot, 0.0)
    n = state["pos"].shape[-1]
    keys = rope(state["k"], state["pos"], theta).repeat_interleave(g, dim=1)
    query = rope(q, torch.full((b, 1), t), theta)
    w = torch.softmax(query @ keys.transpose(-1, -2) / math.sqrt(d), dim=-1)   # [B, H, 1, n]
    state["score"] += w[:, :, 0].reshape(b, hkv, g, n).sum(dim=2)
    return w @ state["v"].repeat_interleave(g, dim=1), state
