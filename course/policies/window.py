"""A sliding window: keep the most recent tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from course.policies.base import Policy, PositionRule, check_int, check_rule
from course.policies.registry import PolicyKind, register
from course.policies.sinks import pinned

if TYPE_CHECKING:  # pragma: no cover
    from course.slots import LayerCache

__all__ = ["SlidingWindow"]


class SlidingWindow(Policy):
    """Keep the ``window`` most recent tokens: evict the oldest (a ring buffer)."""

    name = "window"
    is_static = True

    def __init__(self, window: int, positions: PositionRule = "original") -> None:
        self.window = check_int("window", window, 1)
        self.budget = window
        self.position_rule = check_rule(positions)

    def scores(self, layer: LayerCache, seen: int) -> Tensor:
        return layer.positions[:, :, : layer.length].float()

    def visible(self, q_pos: Tensor, k_pos: Tensor, slots: int | None = None) -> Tensor:
        return q_pos - k_pos < (self.window if slots is None else slots)

    @property
    def label(self) -> str:
        return f"window({self.window})"

register(PolicyKind("window", lambda budget, sinks, rule, **o: pinned(SlidingWindow(budget, rule), sinks),
                    explorer_sinks=False))
