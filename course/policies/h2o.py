"""H2O, the Heavy-Hitter Oracle: keep the tokens that received the most attention."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from course.policies.base import PROTECTED, Policy, PositionRule, check_int, check_rule, group_mean
from course.policies.registry import PolicyKind, register
from course.policies.sinks import pinned

if TYPE_CHECKING:  # pragma: no cover
    from course.slots import LayerCache

__all__ = ["H2O", "accumulate_attention"]


def accumulate_attention(layer: LayerCache, weights: Tensor) -> None:
    """Add the attention each cached key received ([B, H, rows, S]) to the layer's running sums
    (``layer.stat("attention")``, [B, H_kv, S]), averaged over the query heads of each GQA group."""
    acc = layer.stat("attention")
    acc += group_mean(weights.float(), layer.keys.shape[1]).sum(dim=2)


class H2O(Policy):
    """Zhang et al. 2023 (arXiv 2306.14048), Heavy-Hitter Oracle: keep the tokens that received the most attention.

    Every KV head accumulates the attention each cached key has received, summed over the queries and
    averaged over the query heads of its GQA group. The paper (and its reference code, whose
    ``_update_hh_score`` adds each step's attention to a running score) ranks keys by these **raw sums**,
    the default here (``make_policy("h2o")``). Raw sums favour old tokens: key ``j`` has been seen by
    ``seen - j`` queries, the newest key by one. ``normalize=True`` is the variant ``"h2o-mean"``, which
    divides by that count (mean attention per query that could see the key), as NVIDIA kvpress's
    ObservedAttentionPress does. The ``recent`` newest tokens are kept before any heavy hitter;
    budget = heavy + recent slots per KV head.
    """

    def __init__(self, heavy: int, recent: int, positions: PositionRule = "original", normalize: bool = False) -> None:
        self.heavy = check_int("heavy", heavy, 0)
        self.recent = check_int("recent", recent, 0)
        self.budget = check_int("heavy + recent", heavy + recent, 1)
        self.position_rule = check_rule(positions)
        self.normalize = bool(normalize)
        self.name = "h2o-mean" if self.normalize else "h2o"
        self.eviction_stats = ("attention",)

    def attention_rows(self, n_queries: int) -> int:
        return n_queries

    def observe(self, layer: LayerCache, weights: Tensor, seen: int) -> None:
        accumulate_attention(layer, weights)

    def scores(self, layer: LayerCache, seen: int) -> Tensor:
        pos = layer.positions[:, :, : layer.length]
        s = layer.stat("attention")
        if self.normalize:
            s = s / (seen - pos).clamp(min=1).float()  # queries that could see each key
        return torch.where(pos >= seen - self.recent, PROTECTED + pos, s)

    @property
    def label(self) -> str:
        return f"{self.name}({self.heavy}+{self.recent})"


def _h2o(budget: int, rule: PositionRule, recent: int | None, normalize: bool) -> H2O:
    r = budget // 2 if recent is None else check_int("recent", recent, 0)
    if r > budget:
        raise ValueError(f"recent must be at most the budget ({budget}), got {r}")
    return H2O(budget - r, r, rule, normalize=normalize)

register(PolicyKind(
    "h2o", lambda budget, sinks, rule, recent=None, **o: pinned(_h2o(budget, rule, recent, False), sinks),
    needs_weights=True))
register(PolicyKind(
    "h2o-mean", lambda budget, sinks, rule, recent=None, **o: pinned(_h2o(budget, rule, recent, True), sinks),
    needs_weights=True, shown_in=frozenset({"compare"})))
