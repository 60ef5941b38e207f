# The victim found with Python loops (per batch row and KV head: the lowest score among the slots older than the
# recent window), the kept slots gathered with one index; then the new token appended and attended per KV head.
import math

import torch

from course.rope import rope


def h2o_step(state, q, k, v, t, budget, recent, theta):
    b, hkv, _, d = k.shape
    g = q.shape[1] // hkv
    if state is None:
        state = {"k": k[:, :, :0], "v": v[:, :, :0], "pos": torch.zeros(b, hkv, 0, dtype=torch.long),
                 "score": k.new_zeros(b, hkv, 0)}
    n = state["pos"].shape[-1]
    if n >= budget:
        keep = torch.empty(b, hkv, n - 1, dtype=torch.long)
        for row in range(b):
            for kv in range(hkv):
                pos, score = state["pos"][row, kv].tolist(), state["score"][row, kv].tolist()
                old = [i for i in range(n) if pos[i] < t - recent]
                victim = min(old, key=lambda i: score[i]) if old else 0
                keep[row, kv] = torch.tensor([i for i in range(n) if i != victim])
        wide = keep[..., None].expand(-1, -1, -1, d)
        state = {"k": state["k"].gather(2, wide), "v": state["v"].gather(2, wide),
                 "pos": state["pos"].gather(2, keep), "score": state["score"].gather(2, keep)}
    state = {"k": torch.cat([state["k"], k], 2), "v": torch.cat([state["v"], v], 2),
             "pos": torch.cat([state["pos"], torch.full((b, hkv, 1), t)], 2),
             "score": torch.cat([state["score"], k.new_zeros(b, hkv, 1)], 2)}
    query = rope(q, torch.full((b, 1), t), theta)
    keys = rope(state["k"], state["pos"], theta)
    out = torch.empty_like(query)
    for kv in range(hkv):
        heads = slice(kv * g, (kv + 1) * g)
        w = torch.softmax(query[:, heads] @ keys[:, kv:kv + 1].transpose(-1, -2) / math.sqrt(d), dim=-1)  # [B, G, 1, S]
        out[:, heads] = w @ state["v"][:, kv:kv + 1]
        state["score"][:, kv] += w[:, :, 0].sum(dim=1)
    return out, state
