"""One layer's parts seen as one: the transient padded view attention takes (``padded_view``) and the split of its
attention weights back to the parts (``part_weights``).

Each part hands back its own ``AttentionView`` over its KV heads ([B, h_part, n_part, d]). The layer attends with
keys/values [B, H_kv, S_max, d] where each KV head's slots come first and the rest is padding, hidden by the
per-KV-head mask [B, H_kv, T, S_max]. The padding costs bytes only for the length of one forward: the cache keeps
the parts alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from course.kvcache import AttentionView

__all__ = ["padded_view", "part_weights", "query_heads"]


def query_heads(kv_heads: Tensor, n_heads: int, n_kv_heads: int) -> Tensor:
    """The query heads that read the KV heads ``kv_heads`` ([h] long) under grouped-query attention: query head
    q reads KV head q // G, G = n_heads / n_kv_heads. Returns [h * G] long, grouped by KV head."""
    g = n_heads // n_kv_heads
    return (kv_heads[:, None] * g + torch.arange(g, device=kv_heads.device)).flatten()


def padded_view(heads: Sequence[Tensor], views: Sequence[AttentionView], q_pos: Tensor) -> AttentionView:
    """The parts' views of one layer as one view over every KV head.

    heads: per part, its KV heads ([h_part] long); views: per part, its view (keys [B, h_part, n_part, d]);
    q_pos: [B, T] the new tokens' original positions. Returns keys/values [B, H_kv, S_max, d] (zeros past a head's
    slots), positions [B, H_kv, S_max] (-1 there), mask [B, H_kv, T, S_max] (False there, else the part's own
    mask) and the most weight rows any part asked for. RoPE positions (the readable path): the queries at their
    original positions, each part's keys shifted by that part's (q_pos - q_rope), so every key keeps the distance
    to the query that its own part's rule gives it."""
    first = views[0]
    b, _, _, d = first.keys.shape
    kv = sum(int(h.numel()) for h in heads)
    s_max = max(v.keys.shape[2] for v in views)
    t = first.n_queries
    keys = first.keys.new_zeros(b, kv, s_max, d)
    values = first.values.new_zeros(b, kv, s_max, first.values.shape[-1])
    positions = first.positions.new_full((b, kv, s_max), -1)
    mask = torch.zeros(b, kv, t, s_max, dtype=torch.bool, device=keys.device)
    for idx, view in zip(heads, views):
        n = view.keys.shape[2]
        keys[:, idx, :n] = view.keys
        values[:, idx, :n] = view.values
        positions[:, idx, :n] = view.positions
        mask[:, idx, :, :n] = True if view.mask is None else view.mask

    def rope_positions() -> tuple[Tensor, Tensor, None]:
        k_rope = positions.clone()
        for idx, view in zip(heads, views):
            shift = (q_pos - view.q_rope)[:, -1:, None]  # [B, 1, 1]: the part's queries sit this far from q_pos
            k_rope[:, idx, : view.keys.shape[2]] = view.k_rope + shift
        return q_pos, k_rope, None

    return AttentionView(keys, values, positions, mask, max(v.weight_rows for v in views), t, rope_positions)


def part_weights(weights: Tensor, kv_heads: Tensor, n_kv_heads: int, n_slots: int) -> Tensor:
    """A part's share of a layer's attention weights [B, H, rows, S_max]: its query heads and its first
    ``n_slots`` slots, [B, h_part * G, rows, n_slots] (padding has weight 0: nothing is lost)."""
    return weights[:, query_heads(kv_heads, weights.shape[1], n_kv_heads), :, :n_slots]
