"""How sure a number is: the interval every verdict of the course is judged on.

A verdict computed from a point value (a median over four passages) hides how much the next four passages
could move it. Every verdict the course prints is judged on an interval instead (``interval``):

* from ``MIN_FOR_INTERVAL`` values on, a bootstrap 95 % interval of the statistic (the values resampled with
  replacement, 2000 times, with a fixed seed so that a run gives the same interval again);
* with fewer values (2 to 7), the full range of the values: a bootstrap interval from so few values mostly
  restates the range, and the range is the honest summary;
* with one value (a configuration's arithmetic, one timing), the value itself.

    interval([1.2, 1.5, 0.9, 1.1])            # Interval(point=1.15, low=0.9, high=1.5, n=4, how="range")
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MIN_FOR_INTERVAL", "STATISTICS", "Interval", "interval", "bootstrap_interval"]

MIN_FOR_INTERVAL = 8  # a bootstrap interval of the median from fewer values mostly restates the range
STATISTICS = {"median": statistics.median, "mean": statistics.fmean}


@dataclass(frozen=True)
class Interval:
    """A statistic of ``n`` values and the interval a verdict is judged on (``how`` says which interval)."""

    point: float
    low: float
    high: float
    n: int
    how: str        # "95% bootstrap interval", "range" or "one value"
    statistic: str  # "median" or "mean"

    def __str__(self) -> str:
        if self.n == 1:
            return f"{self.point:.3g} (n = 1)"
        return f"{self.statistic} {self.point:.3g}, {self.how} {self.low:.3g} to {self.high:.3g} (n = {self.n})"


def _values(values) -> tuple[float, ...]:
    values = getattr(values, "values", values)  # a course.passages.Spread gives its values
    if isinstance(values, (int, float)):
        values = (values,)
    out = tuple(float(v) for v in values)
    if not out or not all(math.isfinite(v) for v in out):
        raise ValueError(f"an interval needs at least one finite value, got {out}")
    return out


def bootstrap_interval(values: Sequence[float], statistic: str = "median", seed: int = 0,
                       resamples: int = 2000) -> tuple[float, float]:
    """The bootstrap 95 % interval of ``statistic`` ("median" or "mean") of ``values`` (percentile method)."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    values = _values(values)
    fn, rng = STATISTICS[statistic], random.Random(seed)
    stats = sorted(fn(rng.choices(values, k=len(values))) for _ in range(resamples))
    return stats[int(0.025 * resamples)], stats[int(0.975 * resamples) - 1]


def interval(values, statistic: str = "median") -> Interval:
    """``statistic`` of ``values`` (a number, a sequence, or a ``Spread``) and its interval: a bootstrap 95 %
    interval from ``MIN_FOR_INTERVAL`` values on, the full range below, the value itself for one value."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    values = _values(values)
    point = STATISTICS[statistic](values)
    if len(values) == 1:
        return Interval(point, point, point, 1, "one value", statistic)
    if len(values) >= MIN_FOR_INTERVAL:
        low, high = bootstrap_interval(values, statistic)
        return Interval(point, low, high, len(values), "95% bootstrap interval", statistic)
    return Interval(point, min(values), max(values), len(values), "range", statistic)
