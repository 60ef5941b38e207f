"""Several caches fed by one forward pass over a prompt (``CacheGroup``): the fair start of a comparison."""

from __future__ import annotations

import torch
from torch import Tensor

from course.kvcache.cache import KVCache
from course.kvcache.view import AttentionView

__all__ = ["CacheGroup"]


class CacheGroup:
    """Several caches fed by *one* forward pass over a prompt: the fair start of a comparison.

    Every member stores the same new keys and values (a prompt runs with full causal attention
    whatever the policy, so every member hands the layer the same view), and each member's policy
    reads the attention rows it asked for from the one set of weights the layer computed (the
    most rows any member wants). So every contender compresses literally the same computation,
    and a comparison of N policies costs one prompt forward instead of N.

    The model sees a group as one cache (``shape``, ``dtype``, ``seen``, ``update``, ``observe``,
    ``advance``). Only for prompts: a member that would evict during the forward (a single new
    token arriving at a full cache) would make the views differ, and is refused.
    """

    def __init__(self, caches: list[KVCache]) -> None:
        if not caches:
            raise ValueError("CacheGroup needs at least one cache")
        first = caches[0]
        for c in caches[1:]:
            if (c.shape, c.dtype, c.seen, c.rope_theta) != (first.shape, first.dtype, first.seen, first.rope_theta):
                raise ValueError(f"the caches of a group must have one shape, dtype, stream position and key rotation; "
                                 f"got {first!r} and {c!r}")
        if any(c.chunks != "prompt" for c in caches):
            raise ValueError("a CacheGroup shares a prompt forward: make its caches with chunks='prompt'")
        self.caches = caches
        self.shape, self.dtype, self.rope_theta = first.shape, first.dtype, first.rope_theta

    @property
    def seen(self) -> int:
        return self.caches[0].seen

    def update(self, layer_idx: int, k: Tensor, v: Tensor, pos: Tensor) -> AttentionView:
        """Store the new tokens in every member; return the view they share (with the most weight rows any
        member asked for)."""
        views = [c.update(layer_idx, k, v, pos) for c in self.caches]
        first = views[0]
        for view in views[1:]:
            same = (view.keys.shape == first.keys.shape and torch.equal(view.positions, first.positions)
                    and torch.equal(view.q_rope, first.q_rope) and torch.equal(view.k_rope, first.k_rope)
                    and view.sink_rotation is None and first.sink_rotation is None)
            if not same:
                raise ValueError("the caches of a group would attend differently (other slots or positions): a group "
                                 "can only share the forward of a prompt that starts every member alike")
        return AttentionView(first.keys, first.values, first.positions, first.mask,
                             max(view.weight_rows for view in views), first.n_queries, first.rope_positions)

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        return self.caches[0].rotate(x, pos)

    def observe(self, layer_idx: int, weights: Tensor | None) -> None:
        """Every member takes the last rows its own policy asked for."""
        for c in self.caches:
            c.observe(layer_idx, weights)

    def advance(self, n_tokens: int) -> None:
        for c in self.caches:
            c.advance(n_tokens)
