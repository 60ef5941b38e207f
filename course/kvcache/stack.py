"""Several caches decoding side by side (``CacheStack``): one forward per token for every contender of a comparison.

After ``course.compression.compress_prompts`` each contender holds its own compressed cache, and every contender is
then fed the same tokens (teacher forcing). Fed one contender at a time, that costs a whole forward per contender per
token; and a one-token forward of a small model on a CPU is paid for in reading the weights, not in arithmetic
(SmolLM2-135M on two cores: about 40 ms for one row, 145 ms for thirteen rows at once, not 520).

A stack is one cache to the model, whose batch is its members' batches one after the other (member i: rows
[i·B, (i+1)·B)). A layer's ``update`` gives each member its own rows' keys and values and takes back each member's
own view; the stack pads those views to the longest (keys and values 0, position -1, masked out) and joins them
along the batch, so every row attends to its own cache's slots and to nothing else (a masked slot's weight is
exactly 0). ``observe`` gives each member its rows' weights over its own slots. Eviction, the stores and the
policies' statistics stay each member's own.

What changes is only the grouping of the arithmetic: a member's numbers agree with a forward of its own to rounding
(about 1e-5 in SmolLM2's float32 logits, 1e-12 in float64). Decoding only: the members must be at the same place in
the stream, and a chunk of the exact evaluator (whose view carries a sink rotation) is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from course.kvcache.cache import KVCache
from course.kvcache.view import AttentionView, SinkRotation

__all__ = ["CacheStack", "stacked_view"]


class CacheStack:
    """Caches that decode side by side, seen by the model as one cache (``shape``, ``dtype``, ``seen``,
    ``rope_theta``, ``start``, ``update``, ``rotate``, ``observe``, ``advance``). Members: ``KVCache`` or
    ``course.headwise.HeadwiseCache``, of one model, at the same stream position."""

    def __init__(self, caches: Sequence[KVCache]) -> None:
        if not caches:
            raise ValueError("CacheStack needs at least one cache")
        first = caches[0]
        for c in caches:
            if (c.shape[0], *c.shape[2:], c.dtype, c.seen, c.rope_theta) != (
                    first.shape[0], *first.shape[2:], first.dtype, first.seen, first.rope_theta):
                raise ValueError(f"the caches of a stack must have one model's shape (layers, KV heads, head_dim), "
                                 f"one dtype, stream position and key rotation; got {first!r} and {c!r}")
            if c.start is not None:
                raise ValueError("a stack takes caches of unpadded streams (start is None): a left-padded batch "
                                 "masks its padding itself")
        self.caches = list(caches)
        self.rows = [c.shape[1] for c in caches]
        self.shape = (first.shape[0], sum(self.rows), *first.shape[2:])
        self.dtype, self.rope_theta, self.start = first.dtype, first.rope_theta, None
        self._slots: dict[int, list[int]] = {}  # per layer, each member's slots in the last update

    def __repr__(self) -> str:
        return f"CacheStack({len(self.caches)} caches, {self.shape[1]} rows)"

    @property
    def seen(self) -> int:
        return self.caches[0].seen

    def update(self, layer_idx: int, k: Tensor, v: Tensor, pos: Tensor, mask: bool = True) -> AttentionView:
        """k, v: [n·B, H_kv, T, d]; pos: [n·B, T]. Each member stores its rows; returns their views as one
        (``stacked_view``)."""
        if not mask:
            raise ValueError("a stack builds the mask that hides each member's padding: mask=False is refused")
        views = [cache.update(layer_idx, k_i, v_i, pos_i)
                 for cache, k_i, v_i, pos_i in zip(self.caches, *(x.split(self.rows) for x in (k, v, pos)))]
        self._slots[layer_idx] = [view.keys.shape[2] for view in views]
        return stacked_view(views)

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        """RoPE at ``pos`` ([n·B, T]) for the model's fast path: every member rotates alike (one ``rope_theta``)."""
        return self.caches[0].rotate(x, pos)

    def observe(self, layer_idx: int, weights: Tensor | None) -> None:
        """weights [n·B, H, rows, S_max] (or None): each member gets its rows over its own slots."""
        slots = self._slots.pop(layer_idx)
        parts = [None] * len(self.caches) if weights is None else weights.split(self.rows)
        for cache, w, n in zip(self.caches, parts, slots):
            cache.observe(layer_idx, None if w is None else w[..., :n])

    def advance(self, n_tokens: int) -> None:
        for cache in self.caches:
            cache.advance(n_tokens)


def stacked_view(views: Sequence[AttentionView]) -> AttentionView:
    """Views of the same layer and queries, one per member ([B_i, H_kv, S_i, d] each), as one over their rows:
    keys/values [ΣB_i, H_kv, S_max, d] (zeros past a member's slots), positions -1 there, mask [ΣB_i, H_kv, T, S_max]
    False there (else the member's own mask; None when every member has the same slots and no mask), the most
    weight rows any member asked for, and RoPE positions joined along the batch the same way."""
    s_max = max(view.keys.shape[2] for view in views)
    t = views[0].n_queries
    if all(view.keys.shape[2] == s_max and view.mask is None for view in views):
        mask = None
    else:
        b, kv = sum(view.keys.shape[0] for view in views), views[0].keys.shape[1]
        mask = torch.zeros(b, kv, t, s_max, dtype=torch.bool, device=views[0].keys.device)
        first = 0  # the member's first row in the joined batch
        for view in views:
            rows, slots = view.keys.shape[0], view.keys.shape[2]
            mask[first : first + rows, :, :, :slots] = True if view.mask is None else view.mask
            first += rows

    def pad(x: Tensor, fill: float, width: int) -> Tensor:  # x [B, H_kv, S, ...] -> [B, H_kv, S_max, ...]
        extra = list(x.shape)
        extra[2] = width - x.shape[2]
        return torch.cat([x, x.new_full(extra, fill)], dim=2) if extra[2] else x

    def joined(get, fill: float) -> Tensor:
        return torch.cat([pad(get(view), fill, s_max) for view in views])

    def rope_positions() -> tuple[Tensor, Tensor, SinkRotation | None]:
        if any(view.sink_rotation is not None for view in views):
            raise ValueError("a stack decodes only: a chunk of the exact evaluator (a sink rotation) is refused")
        return torch.cat([view.q_rope for view in views]), joined(lambda view: view.k_rope, 0), None

    return AttentionView(joined(lambda view: view.keys, 0.0), joined(lambda view: view.values, 0.0),
                         joined(lambda view: view.positions, -1), mask, max(view.weight_rows for view in views), t,
                         rope_positions)
