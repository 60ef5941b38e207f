"""How sure a number is: the interval every verdict of the course is judged on.

A verdict computed from a point value (a median over four passages) hides how much the next four passages
could move it. Every verdict the course prints is judged on an interval instead (``interval``), one whose
stated coverage is true:

* the median of n values: the distribution-free interval [x_(k), x_(n+1-k)] between the k-th smallest and the
  k-th largest value. It misses the population median only when k or more of the n values fall on one side of
  it, so it covers the median with probability exactly

      C(n, k) = 1 - 2 P(Binomial(n, 1/2) <= k - 1)                        (``order_coverage``)

  for any continuous distribution. ``interval`` takes the largest k with C(n, k) >= 95 %; from 2 to 5 values
  no k reaches it, and the interval is the range (k = 1), printed with what it does cover, 1 - 2^(1-n): 50 % at
  n = 2, 75 % at 3, 88 % at 4, 94 % at 5. The first n at which a 95 % interval exists is ``MIN_FOR_INTERVAL``
  (6: the range of six values covers 97 %); k = 2 first reaches it at n = 9, k = 3 at n = 12;
* the mean: a percentile bootstrap interval (2000 resamples, a fixed seed), labelled *nominal* 95 %: at the n
  of a notebook its true coverage is below that, and nothing here claims otherwise;
* one value (a configuration's arithmetic, one memory measurement): the value itself.

A verdict needs ``MIN_FOR_CLAIM`` values; from fewer (2 to 4) a rule says *inconclusive* with its n
(``course.claims.Rule.judge``). A claim a notebook asserts is asserted on the interval's cautious bound, not on its
median (``bound``): "at most 1.3" needs the interval's top at most 1.3; on fewer than ``MIN_FOR_CLAIM`` values it
says so.

    interval([1.2, 1.5, 0.9, 1.1])            # Interval(point=1.15, low=0.9, high=1.5, n=4, how="range", ...)
    interval([1.2, 1.5, 0.9, 1.1]).coverage   # 0.875
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MIN_FOR_INTERVAL", "MIN_FOR_CLAIM", "LEVEL", "STATISTICS", "Interval", "interval", "bootstrap_interval",
           "order_coverage", "range_coverage", "median_interval", "proportion_interval", "Paired", "paired",
           "Bound", "bound"]

LEVEL = 0.95          # the coverage every interval of a median aims at
MIN_FOR_INTERVAL = 6  # the fewest values whose median interval reaches LEVEL: the range of 6 covers 1 - 2^-5 = 97 %
MIN_FOR_CLAIM = 5     # a verdict rests on at least this many values (range coverage 94 %); fewer are inconclusive
STATISTICS = {"median": statistics.median, "mean": statistics.fmean}
Z95 = 1.959964  # the normal quantile of a two-sided 95 % interval
RANGE = "range"
ORDER = "order-statistic interval"
BOOTSTRAP = "nominal 95% bootstrap interval"
ONE_VALUE = "one value"


@dataclass(frozen=True)
class Interval:
    """A statistic of ``n`` values and the interval a verdict is judged on (``how`` says which interval,
    ``coverage`` how often an interval made this way covers the population's median: exact for the range and
    the order-statistic interval, the nominal 0.95 for a bootstrap of the mean, None for one value)."""

    point: float
    low: float
    high: float
    n: int
    how: str        # RANGE, ORDER, BOOTSTRAP or ONE_VALUE
    statistic: str  # "median" or "mean"
    coverage: float | None = None

    def __str__(self) -> str:
        if self.n == 1:
            return f"{self.point:.3g} (n = 1)"
        cover = f"nominal {self.coverage:.0%}" if self.how == BOOTSTRAP else f"coverage {self.coverage:.0%}"
        return (f"{self.statistic} {self.point:.3g}, {self.how} {self.low:.3g} to {self.high:.3g} (n = {self.n}, "
                f"{cover})")


def _count(n, name: str = "n", least: int = 1) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {n!r}")
    return n


def order_coverage(n: int, k: int) -> float:
    """C(n, k): the probability that [x_(k), x_(n+1-k)], the k-th smallest to the k-th largest of ``n``
    independent values, covers their population median: 1 - 2 P(Binomial(n, 1/2) <= k - 1)."""
    _count(n, "n", 2)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n // 2:
        raise ValueError(f"k must be an integer from 1 to n // 2 = {n // 2}, got {k!r}")
    tail = sum(math.comb(n, i) for i in range(k)) / 2**n
    return 1 - 2 * tail


def range_coverage(n: int) -> float:
    """The probability that [min, max] of ``n`` independent values covers their population median:
    1 - 2^(1-n) (it misses only when all n values fall on the same side)."""
    return order_coverage(n, 1)


def median_interval(values: Sequence[float]) -> tuple[float, float, int, float]:
    """``(low, high, k, coverage)``: the order-statistic interval of the median of ``values`` (at least two),
    [x_(k), x_(n+1-k)] with the largest k whose coverage reaches ``LEVEL`` (k = 1, the range, when none does)."""
    xs = sorted(_values(values))
    n = _count(len(xs), "the number of values", 2)
    k = max((j for j in range(1, n // 2 + 1) if order_coverage(n, j) >= LEVEL), default=1)
    return xs[k - 1], xs[n - k], k, order_coverage(n, k)


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
    """The percentile bootstrap interval of nominal 95 % of ``statistic`` ("median" or "mean") of ``values``: at
    small n its true coverage is lower (for a median at n = 8, about 92 %), which is why ``interval`` gives the
    median an order-statistic interval instead."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    values = _values(values)
    fn, rng = STATISTICS[statistic], random.Random(seed)
    stats = sorted(fn(rng.choices(values, k=len(values))) for _ in range(resamples))
    return stats[int(0.025 * resamples)], stats[int(0.975 * resamples) - 1]


def interval(values, statistic: str = "median") -> Interval:
    """``statistic`` of ``values`` (a number, a sequence, or a ``Spread``) and its interval: for the median the
    order-statistic interval (the range below ``MIN_FOR_INTERVAL`` values, with its coverage), for the mean a
    nominal 95 % bootstrap interval, the value itself for one value."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    values = _values(values)
    point = STATISTICS[statistic](values)
    if len(values) == 1:
        return Interval(point, point, point, 1, ONE_VALUE, statistic)
    if statistic == "mean":
        low, high = bootstrap_interval(values, statistic)
        return Interval(point, low, high, len(values), BOOTSTRAP, statistic, LEVEL)
    low, high, k, coverage = median_interval(values)
    return Interval(point, low, high, len(values), RANGE if k == 1 else ORDER, statistic, coverage)


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
class Paired:
    """Two contenders' right/wrong outcomes on the same prompts, paired by prompt: how many both got right,
    only the first, only the second, neither, and ``p``, the two-sided exact sign test on the prompts where they
    differ (McNemar's exact test): the probability, were the two equally good, of a split at least this uneven."""

    both: int
    only_first: int
    only_second: int
    neither: int
    p: float

    @property
    def discordant(self) -> int:
        return self.only_first + self.only_second

    def __str__(self) -> str:
        n = self.both + self.only_first + self.only_second + self.neither
        return (f"{n} prompts: both right {self.both}, only the first {self.only_first}, only the second "
                f"{self.only_second}, neither {self.neither}; exact sign test on the {self.discordant} that differ: "
                f"p = {self.p:.3g}")


def paired(first: Sequence[bool], second: Sequence[bool]) -> Paired:
    """Pair two contenders' outcomes prompt by prompt (``first[i]`` and ``second[i]``: prompt i right or wrong)
    and test them exactly: with d prompts where they differ, k of them won by the less frequent winner,
    p = min(1, 2 sum_{i <= k} C(d, i) / 2^d). Reaching p < 0.05 needs at least 6 differing prompts all one way."""
    first, second = [bool(x) for x in first], [bool(x) for x in second]
    if len(first) != len(second) or not first:
        raise ValueError(f"first and second must give one outcome per prompt, the same prompts: got {len(first)} "
                         f"and {len(second)}")
    only_first = sum(a and not b for a, b in zip(first, second))
    only_second = sum(b and not a for a, b in zip(first, second))
    both = sum(a and b for a, b in zip(first, second))
    d, k = only_first + only_second, min(only_first, only_second)
    p = 1.0 if d == 0 else min(1.0, 2 * sum(math.comb(d, i) for i in range(k + 1)) / 2**d)
    return Paired(both, only_first, only_second, len(first) - both - d, p)


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
