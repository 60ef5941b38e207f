"""Pinned sinks: wrap any policy so that the first tokens of the stream are never evicted."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from course.policies.base import INF, Policy, PositionRule, check_int, check_rule

if TYPE_CHECKING:  # pragma: no cover
    from course.slots import LayerCache

__all__ = ["PinSinks", "pinned"]


class PinSinks(Policy):
    """Wrap any policy so that the first ``n_sink`` tokens of the stream are never evicted.

    The sinks count against the wrapped policy's budget: ``PinSinks(H2O(60, 40), 4)`` still
    keeps 100 slots, 4 of them sinks. It also works as a plug-in for SnapKV and random eviction.
    """

    def __init__(self, inner: Policy, n_sink: int = 4, positions: PositionRule | None = None, start: int = 0) -> None:
        self.inner = inner
        self.n_sink = check_int("n_sink", n_sink, 0)
        self.start = check_int("start", start, 0)
        if inner.prompt_budget is not None and n_sink >= inner.prompt_budget:
            raise ValueError(f"n_sink must be smaller than the budget ({inner.prompt_budget}), got {n_sink}")
        self.budget = inner.budget
        self.position_rule = inner.position_rule if positions is None else check_rule(positions)
        if start and self.position_rule == "cache":
            raise ValueError("pinning tokens other than the first (start > 0) needs positions='original'")
        self.is_static = inner.is_static
        self.eviction_stats = inner.eviction_stats
        self.name = f"{inner.name}+sinks"

    @property
    def prompt_budget(self) -> int | None:
        return self.inner.prompt_budget

    def pinned(self, k_pos: Tensor) -> Tensor:
        return (k_pos >= self.start) & (k_pos < self.start + self.n_sink)

    def scores(self, layer: LayerCache, seen: int) -> Tensor:
        s = self.inner.scores(layer, seen)
        return s.masked_fill(self.pinned(layer.positions[:, :, : layer.length]), INF)

    def attention_rows(self, n_queries: int) -> int:
        return self.inner.attention_rows(n_queries)

    def observe(self, layer: LayerCache, weights: Tensor, seen: int) -> None:
        self.inner.observe(layer, weights, seen)

    def visible(self, q_pos: Tensor, k_pos: Tensor, slots: int | None = None) -> Tensor:
        if self.budget is None:
            return self.inner.visible(q_pos, k_pos)
        # The static inner policy is a sliding window: the cache holds the pinned tokens that have
        # arrived (p_q of them) and the budget - p_q most recent others. A key is visible if fewer
        # than that many unpinned tokens came after it.
        s, n = self.start, self.n_sink
        p_q = (q_pos - s + 1).clamp(0, n)
        pinned_after_k = (torch.minimum(q_pos, torch.full_like(q_pos, s + n - 1))
                          - torch.maximum(k_pos + 1, torch.full_like(k_pos, s)) + 1).clamp(0, n)
        return self.pinned(k_pos) | (q_pos - k_pos - pinned_after_k < self.budget - p_q)

    @property
    def label(self) -> str:
        where = f" at {self.start}" if self.start else ""
        return f"{self.inner.label}+{self.n_sink} sinks{where}"


def pinned(policy: Policy, sinks: int) -> Policy:
    """``policy`` with its first ``sinks`` tokens pinned (itself when ``sinks`` is 0)."""
    return PinSinks(policy, sinks) if sinks else policy
