"""The interface every policy implements (``Policy``), and what the policies share: the position rules, the
checks of their arguments, the score that pins a slot, and GQA averaging.

Policies read a layer's slots (``course.slots.LayerCache``), the floor below them; they never import the cache
that uses them (``course.kvcache``) nor the stores (``course.storage``): which slots survive, nothing about bytes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from course.slots import LayerCache

__all__ = ["Policy", "PositionRule", "INF", "PROTECTED", "check_int", "check_rule", "group_mean", "no_reassignment"]

PositionRule = Literal["original", "cache"]
INF = math.inf  # pinned: never evicted
PROTECTED = 1e9  # kept before any scored slot, but evicted before a pinned sink (plus position: oldest first)


def check_int(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def check_rule(positions: str) -> PositionRule:
    if positions not in ("original", "cache"):
        raise ValueError(f"positions must be 'original' or 'cache', got {positions!r}")
    return positions  # type: ignore[return-value]


def group_mean(weights: Tensor, kv_heads: int) -> Tensor:
    """Average per-query-head numbers within each GQA group: [B, H, ...] -> [B, H_kv, ...].

    Query heads h*G .. h*G+G-1 share KV head h (G = H / H_kv), as in transformers' repeat_kv.
    """
    b, h = weights.shape[:2]
    return weights.reshape(b, kv_heads, h // kv_heads, *weights.shape[2:]).mean(dim=2)


class Policy:
    """The interface. Subclasses override ``scores`` and, when they need attention, ``observe``."""

    name = "policy"
    budget: int | None = None  # slots per KV head while decoding (None: never evict)
    position_rule: PositionRule = "original"
    is_static = False  # the choice depends on positions only (the exact evaluator applies)
    eviction_stats: tuple[str, ...] = ()  # per-slot statistics (``LayerCache.stats``) its decode-time scores read
    # The store the caller chose for the kept tokens (``make_policy(..., quantizer=...)``), carried for the cache that
    # composes the two (``course.kvcache``); the policy never reads it. None: full precision.
    quantizer: object | None = None

    @property
    def prompt_budget(self) -> int | None:
        """Slots kept when a prompt is compressed (``KVCache.compress``)."""
        return self.budget

    def scores(self, layer: LayerCache, seen: int | Tensor) -> Tensor:
        """Keep-priority of every cached slot: [B, H_kv, S] float; inf = never evict. ``seen``: the tokens the
        stream has had (in a left-padded batch, each row's: a [B, 1, 1] tensor, ``KVCache.row_seen``)."""
        raise NotImplementedError

    def attention_rows(self, n_queries: int) -> int:
        """How many of the last query rows' attention weights ``observe`` needs (0: none)."""
        return 0

    def observe(self, layer: LayerCache, weights: Tensor, seen: int) -> None:
        """Receive attention weights [B, H, rows, S] over the cached slots (after the update)."""

    def visible(self, q_pos: Tensor, k_pos: Tensor, slots: int | None = None) -> Tensor:
        """Static policies: may a query at q_pos see a key at k_pos (broadcasting bool)?"""
        raise NotImplementedError(f"{self.name} is not decided by positions alone")

    def pinned(self, k_pos: Tensor) -> Tensor:
        """Which keys are pinned sinks (bool, same shape as k_pos)."""
        return torch.zeros_like(k_pos, dtype=torch.bool)

    def cache_ranks(self, k_pos: Tensor) -> Tensor:
        """Positions of the cached keys under the cache rule: each slot's rank among the cached original
        positions, 0 for the oldest ([B, H_kv, S] long -> [B, H_kv, S] long; slots are not in token order)."""
        return k_pos.argsort(dim=-1).argsort(dim=-1)

    def check_model(self, config) -> None:
        """Refuse combinations a model (its ``ModelConfig``) cannot do: GPT-2 cannot re-assign positions."""
        if self.position_rule == "cache" and not config.reassigns_positions:
            raise ValueError(no_reassignment(self.label, config))

    @property
    def label(self) -> str:
        """A short name for tables and plots."""
        return self.name

    def __repr__(self) -> str:
        return self.label if self.quantizer is None else f"{self.label}@{self.quantizer.label}"


def no_reassignment(what: str, config) -> str:
    return (
        f"{what} re-assigns positions inside the cache, which {config.name} (GPT-2 family) cannot do: its positions "
        "are learned embeddings added to the input, so every cached key and value already carries its original "
        "position and changing it would mean recomputing them. Use positions='original' (streams of at most "
        f"{config.max_positions} tokens), or a RoPE model."
    )
