"""StreamingLLM: attention sinks plus a recent window."""

from __future__ import annotations

from course.policies.base import PositionRule, check_int
from course.policies.registry import PolicyKind, register
from course.policies.sinks import PinSinks
from course.policies.window import SlidingWindow

__all__ = ["StreamingLLM"]


class StreamingLLM(PinSinks):
    """Xiao et al. 2023: ``n_sink`` attention sinks + the ``window`` most recent tokens.

    Cache = [sinks | recent]; positions re-assigned inside the cache by default (RoPE models).
    """

    def __init__(self, n_sink: int = 4, window: int = 1020, positions: PositionRule = "cache") -> None:
        check_int("window", window, 1)
        super().__init__(SlidingWindow(check_int("n_sink", n_sink, 0) + window), n_sink, positions)
        self.window = window
        self.name = "streaming"

    @property
    def label(self) -> str:
        return f"streaming({self.n_sink}+{self.window})"

register(PolicyKind("streaming", lambda budget, sinks, rule, **o: StreamingLLM(sinks, budget - sinks, rule), sinks=4,
                    cache_positions=True))
