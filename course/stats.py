"""How sure a number is: the interval every verdict of the course is judged on.

A verdict computed from a point value (a median over four passages) hides how much the next four passages
could move it. Every verdict the course prints is judged on an interval instead (``interval``):

* from ``MIN_FOR_INTERVAL`` values on, a bootstrap 95 % interval of the statistic (the values resampled with
  replacement, 2000 times, with a fixed seed so that a run gives the same interval again);
* with fewer values (2 to 7), the full range [min, max]. Its coverage is *not* 95 %: over n independent
  values, [min, max] misses the population median only when all n fall on one side of it, so it covers the
  median with probability 1 - 2^(1-n) (``range_coverage``): 50 % at n = 2, 75 % at 3, 88 % at 4, 94 % at 5,
  97 % at 6, 98 % at 7. A bootstrap interval from so few values is narrower still and covers less, which is
  why the range is used; every interval prints its coverage, so that a verdict from three values is read as
  the 75 % statement it is;
* with one value (a configuration's arithmetic, one timing), the value itself.

A claim a notebook asserts is asserted on the interval's cautious bound, not on its median (``bound``):
"at most 1.3" needs the interval's top at most 1.3. It needs ``MIN_FOR_CLAIM`` values, or says that it rests
on fewer.

    interval([1.2, 1.5, 0.9, 1.1])            # Interval(point=1.15, low=0.9, high=1.5, n=4, how="range")
    interval([1.2, 1.5, 0.9, 1.1]).coverage   # 0.875
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MIN_FOR_INTERVAL", "MIN_FOR_CLAIM", "STATISTICS", "Interval", "interval", "bootstrap_interval",
           "range_coverage", "proportion_interval", "Bound", "bound"]

MIN_FOR_INTERVAL = 8  # below it, the range: a bootstrap interval from fewer values is narrower and covers less
MIN_FOR_CLAIM = 5     # an asserted claim rests on at least this many values (range coverage 94 %) or says so
STATISTICS = {"median": statistics.median, "mean": statistics.fmean}
Z95 = 1.959964  # the normal quantile of a two-sided 95 % interval


@dataclass(frozen=True)
class Interval:
    """A statistic of ``n`` values and the interval a verdict is judged on (``how`` says which interval)."""

    point: float
    low: float
    high: float
    n: int
    how: str        # "95% bootstrap interval", "range" or "one value"
    statistic: str  # "median" or "mean"

    @property
    def coverage(self) -> float | None:
        """How often an interval made this way covers the population's median: 0.95 for the bootstrap
        (nominal), 1 - 2^(1-n) for the range of n values, None for one value."""
        return {"95% bootstrap interval": 0.95, "range": range_coverage(self.n)}.get(self.how)

    def __str__(self) -> str:
        if self.n == 1:
            return f"{self.point:.3g} (n = 1)"
        return (f"{self.statistic} {self.point:.3g}, {self.how} {self.low:.3g} to {self.high:.3g} (n = {self.n}, "
                f"coverage {self.coverage:.0%})")


def range_coverage(n: int) -> float:
    """The probability that [min, max] of ``n`` independent values covers their population median:
    1 - 2^(1-n) (it misses only when all n values fall on the same side)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2 (a range needs two values), got {n!r}")
    return 1 - 2.0 ** (1 - n)


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



def proportion_interval(k: int, n: int) -> tuple[float, float]:
    """Wilson's 95 % interval for a proportion of k successes in n trials."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n:
        raise ValueError(f"k must be an integer from 0 to n={n}, got {k!r}")
    p, z2 = k / n, Z95**2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Bound:
    """What an asserted claim is judged on: the interval's cautious ``bound`` (its top for "at most", its
    bottom for "at least") and whether it ``held`` against the threshold."""

    held: bool
    bound: float
    interval: Interval
    text: str


def bound(values, at_most: float | None = None, at_least: float | None = None, statistic: str = "median") -> Bound:
    """Judge "the ``statistic`` of ``values`` is at most ``at_most`` (at least ``at_least``)" on the cautious bound
    of its interval, and say so in one printed line with the interval's coverage; a claim resting on fewer than
    ``MIN_FOR_CLAIM`` values says that too."""
    if (at_most is None) == (at_least is None):
        raise ValueError("bound: give exactly one of at_most= or at_least=")
    iv = interval(values, statistic)
    up = at_least is not None
    edge = iv.low if up else iv.high
    held = edge >= at_least if up else edge <= at_most
    side = f"{'bottom' if up else 'top'} {edge:.3g} {'>=' if up else '<='} {at_least if up else at_most:g}"
    few = f"; rests on n = {iv.n} < {MIN_FOR_CLAIM} values" if iv.n < MIN_FOR_CLAIM else ""
    text = f"{iv}: interval {side}? {'yes' if held else 'no'}{few}"
    print(text)
    return Bound(held, edge, iv, text)
