"""Policies whose decisions are plain functions of tensors: a notebook's own code in the real cache.

A policy (``course.policies.Policy``) is a class, but what makes it StreamingLLM, H2O or SnapKV is a
few small decisions: which slots score lowest, how attention is accumulated, which prompt slots are
selected, which positions cached keys take. ``FunctionPolicy`` runs such decisions, written as
functions of tensors and numbers, exactly where a policy class runs them inside ``KVCache``. The
builders take every other setting from ``make_policy`` for the same arguments (budget split, the
position rule the model allows), so a built policy differs from the course's only by the functions
given, and both can be run through the same decode loop and compared slot by slot.

Every function sees one batch row at a time (``S`` cached slots, ``H_kv`` KV heads, ``H`` query heads):

* ``scores(positions [H_kv, S] long, stat [H_kv, S] float, seen) -> [H_kv, S]``: keep-priority of every
  slot; a decoding step that finds the cache full overwrites the lowest, compression keeps the highest;
* ``observe(stat [H_kv, S], weights [H, rows, S], positions [H_kv, S], seen) -> [H_kv, S]``: the policy's
  per-slot statistic after a forward pass handed it the last ``rows`` queries' attention weights;
* ``ranks(positions [S] long) -> [S]``: the positions RoPE gives one KV head's cached keys under the
  cache rule (StreamingLLM's re-assignment).

``seen`` is the number of tokens processed before the current forward pass. The functions get copies on
the CPU (weights in float32) and may return any tensor-like value of the right shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor

from course.policies import Policy, PositionRule, group_mean, make_policy
from course.policies.base import check_int, check_rule

__all__ = ["FunctionPolicy", "streaming_policy", "h2o_policy", "snapkv_policy", "score_policy"]

ScoresFn = Callable[[Tensor, Tensor, int], Any]
ObserveFn = Callable[[Tensor, Tensor, Tensor, int], Any]
RanksFn = Callable[[Tensor], Any]


def _copy(t: Tensor) -> Tensor:
    """A CPU copy the given function may change in place without touching the cache."""
    return t.detach().to("cpu", copy=True)


def _row(seen: int | Tensor, b: int) -> int:
    """Row ``b``'s tokens seen: ``seen`` itself, or its row in a left-padded batch (``KVCache.row_seen``)."""
    return seen if isinstance(seen, int) else int(seen.reshape(-1)[b])


def _as_tensor(value: Any, shape: tuple[int, ...], what: str) -> Tensor:
    """``value`` as a tensor of ``shape``, or a ValueError naming the function and the shapes."""
    try:
        t = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{what} must return a tensor of shape {list(shape)}, got {type(value).__name__}") from None
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{what} must return a tensor of shape {list(shape)}, got shape {list(t.shape)}")
    return t


class FunctionPolicy(Policy):
    """A policy whose scores, observation and position re-assignment are given functions (see the module).

    budget: slots per KV head while decoding (None: never evict); compress_to: slots kept when a prompt
    is compressed (default: budget); rows(n_queries): how many of the last query rows' weights ``observe``
    needs (default: none); n_sink: the first tokens count as pinned sinks; positions: the position rule.
    """

    def __init__(
        self, scores: ScoresFn, budget: int | None, *, observe: ObserveFn | None = None,
        rows: Callable[[int], int] | None = None, ranks: RanksFn | None = None, compress_to: int | None = None,
        n_sink: int = 0, positions: PositionRule = "original", name: str = "function", label: str | None = None,
    ) -> None:
        for key, value in (("budget", budget), ("compress_to", compress_to)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{key} must be an integer >= 1 or None, got {value!r}")
        check_rule(positions)
        self._scores, self._observe, self._rows, self._ranks = scores, observe, rows, ranks
        self.budget, self._compress_to = budget, compress_to
        self.n_sink, self.position_rule, self.name = n_sink, positions, name
        self._label = label or name

    @property
    def prompt_budget(self) -> int | None:
        return self.budget if self._compress_to is None else self._compress_to

    @property
    def label(self) -> str:
        return self._label

    def pinned(self, k_pos: Tensor) -> Tensor:
        return k_pos < self.n_sink

    def scores(self, layer, seen: int) -> Tensor:
        pos, stat = layer.positions[:, :, : layer.length], layer.stat(self.name)
        rows = [_as_tensor(self._scores(_copy(pos[b]), _copy(stat[b]), _row(seen, b)), pos.shape[1:],
                           "the scores function") for b in range(pos.shape[0])]
        return torch.stack(rows).to(device=pos.device, dtype=torch.float32)

    def attention_rows(self, n_queries: int) -> int:
        return 0 if self._observe is None or self._rows is None else self._rows(n_queries)

    def observe(self, layer, weights: Tensor, seen: int) -> None:
        if self._observe is None:
            return
        pos, stat = layer.positions[:, :, : layer.length], layer.stat(self.name)
        for b in range(pos.shape[0]):
            new = self._observe(_copy(stat[b]), _copy(weights[b].float()), _copy(pos[b]), _row(seen, b))
            stat[b] = _as_tensor(new, stat.shape[1:], "the observe function").to(stat)

    def cache_ranks(self, k_pos: Tensor) -> Tensor:
        if self._ranks is None:
            return super().cache_ranks(k_pos)
        rows = k_pos.reshape(-1, k_pos.shape[-1])
        ranks = [_as_tensor(self._ranks(_copy(r)), r.shape, "the ranks function") for r in rows]
        return torch.stack(ranks).to(device=k_pos.device, dtype=torch.long).reshape(k_pos.shape)


def streaming_policy(scores: Callable[[Tensor, int, int], Any], budget: int, sinks: int = 4, *, model=None,
                     ranks: Callable[[Tensor], Any] | None = None) -> FunctionPolicy:
    """StreamingLLM with a given eviction score and (optionally) position re-assignment.

    scores(positions [H_kv, S] long, seen, n_sink) -> [H_kv, S] keep-priority (the lowest is evicted);
    ranks(positions [S]) -> [S] positions inside the cache (used where the model re-assigns positions).
    Budget, sinks and position rule as ``make_policy("streaming", budget, sinks=sinks, model=model)``.
    """
    ref = make_policy("streaming", budget, sinks=sinks, model=model)
    return FunctionPolicy(lambda pos, stat, seen: scores(pos, seen, ref.n_sink), ref.budget, ranks=ranks,
                          n_sink=ref.n_sink, positions=ref.position_rule, name="streaming",
                          label=f"{ref.label}, functions")


def h2o_policy(accumulate: Callable[[Tensor, Tensor], Any], scores: Callable[..., Any],
               budget: int, *, model=None, recent: int | None = None, mean: bool = False) -> FunctionPolicy:
    """H2O (raw sums, or the h2o-mean variant with ``mean=True``) with a given accumulation and score.

    accumulate(acc [H_kv, S], weights [H, rows, S]) -> [H_kv, S]: acc plus the attention every slot
    received from the rows' queries (every query of a prompt, then one per decoding step);
    scores(acc [H_kv, S], positions [H_kv, S], seen, recent, mean=...) -> [H_kv, S] keep-priority
    (``mean`` is passed only when True, so a four-argument function serves the raw rule).
    Budget, recent split and position rule as ``make_policy("h2o" or "h2o-mean", budget, recent=recent, model=model)``.
    """
    name = "h2o-mean" if mean else "h2o"
    ref = make_policy(name, budget, recent=recent, model=model)
    extra = {"mean": True} if mean else {}
    return FunctionPolicy(lambda pos, acc, seen: scores(acc, pos, seen, ref.recent, **extra), ref.budget,
                          observe=lambda acc, w, pos, seen: accumulate(acc, w), rows=lambda n: n,
                          positions=ref.position_rule, name=name, label=f"{ref.label}, functions")


def snapkv_policy(select: Callable[[Tensor, int, int, str, int], Any], budget: int, *, model=None,
                  obs_window: int = 8, kernel: int = 7, pooling: Literal["avg", "max"] = "max") -> FunctionPolicy:
    """SnapKV with a given selection.

    select(weights [H, w, S], capacity, kernel, pooling, kv_heads) -> [kv_heads, capacity] long: the slots
    each KV head keeps, given the attention of the prompt's last w queries over its S slots (called only
    for a prompt longer than the capacity). Settings and position rule as ``make_policy("snapkv", ...)``.
    """
    ref = make_policy("snapkv", budget, model=model, obs_window=obs_window, kernel=kernel, pooling=pooling)
    capacity = ref.prompt_budget

    def observe(stat: Tensor, weights: Tensor, pos: Tensor, seen: int) -> Tensor:
        kv_heads, s = stat.shape
        if s <= capacity:  # nothing to evict
            return stat
        keep = _as_tensor(select(weights, capacity, ref.kernel, ref.pooling, kv_heads), (kv_heads, capacity),
                          "the select function")
        if keep.dtype.is_floating_point or keep.dtype == torch.bool or bool(((keep < 0) | (keep >= s)).any()):
            raise ValueError(f"the select function must return slot indices (integers 0 .. {s - 1})")
        if any(len(set(row.tolist())) < capacity for row in keep):
            raise ValueError(f"the select function must return {capacity} different slots per KV head")
        return torch.zeros_like(stat).scatter_(1, keep.long().to(stat.device), 1.0)

    def rows(n_queries: int) -> int:
        return ref.attention_rows(n_queries)

    return FunctionPolicy(lambda pos, stat, seen: stat, None, observe=observe, rows=rows, compress_to=capacity,
                          positions=ref.position_rule, name="snapkv", label=f"{ref.label}, functions")


def score_policy(score_fn: Callable[[Tensor, Tensor, int, int], Any], budget: int, *, name: str = "custom"
                 ) -> FunctionPolicy:
    """A policy of your own: keep-scores from ``score_fn(positions, attention, seen, budget)``.

    For every batch row, positions [H_kv, S] are the original stream positions of the cached slots (in slot
    order), attention [H_kv, S] the attention each slot has received so far (summed over the queries and
    averaged within each GQA group, as H2O accumulates it), ``seen`` the tokens seen so far; it returns
    [H_kv, S] keep-scores (higher = keep, inf = never evict). The cache evicts the lowest-scored slot; the
    function sees nothing else (no model, no text, no future). Original positions.
    """
    if not callable(score_fn):
        raise TypeError(f"score_fn must be a function, got {type(score_fn).__name__}")
    check_int("budget", budget, 2)

    def accumulate(acc: Tensor, weights: Tensor, pos: Tensor, seen: int) -> Tensor:
        return acc + group_mean(weights[None], acc.shape[0])[0].sum(dim=1)

    return FunctionPolicy(lambda pos, acc, seen: score_fn(pos, acc, seen, budget), budget, observe=accumulate,
                          rows=lambda n: n, name=name, label=f"{name}({budget})")
