"""SnapKV: compress the prompt once, with votes from its last queries."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch.nn.functional as F
from torch import Tensor

from course.policies.base import PROTECTED, Policy, PositionRule, check_int, check_rule, group_mean
from course.policies.registry import PolicyKind, register
from course.policies.sinks import pinned

if TYPE_CHECKING:  # pragma: no cover
    from course.slots import LayerCache

__all__ = ["SnapKV"]


class SnapKV(Policy):
    """Li et al. 2024: compress the prompt once, with votes from its last queries.

    The last ``obs_window`` queries of the prompt vote, per head, for the earlier keys they
    attend to; votes are pooled over neighbouring positions (``kernel``, avg or max) so whole
    spans survive, averaged within each GQA group, and every KV head keeps its
    ``capacity - obs_window`` best prefix slots plus the observation window itself.
    Decoding then proceeds without eviction.
    """

    name = "snapkv"

    def __init__(
        self, capacity: int, obs_window: int = 8, kernel: int = 7, pooling: Literal["avg", "max"] = "max",
        positions: PositionRule = "original",
    ) -> None:
        self.capacity = check_int("capacity", capacity, 2)
        self.obs_window = check_int("obs_window", obs_window, 1)
        if obs_window >= capacity:
            raise ValueError(f"obs_window must be smaller than capacity ({capacity}), got {obs_window}")
        self.kernel = check_int("kernel", kernel, 1)
        if kernel % 2 == 0:
            raise ValueError(f"kernel must be odd (the pool is centred), got {kernel}")
        if pooling not in ("avg", "max"):
            raise ValueError(f"pooling must be 'avg' or 'max', got {pooling!r}")
        self.pooling = pooling
        self.position_rule = check_rule(positions)
        self.budget = None  # no eviction while decoding

    @property
    def prompt_budget(self) -> int:
        return self.capacity

    def attention_rows(self, n_queries: int) -> int:
        return min(self.obs_window, n_queries) if n_queries > 1 else 0

    def observe(self, layer: LayerCache, weights: Tensor, seen: int) -> None:
        pos = layer.positions[:, :, : layer.length]
        real = pos >= 0  # a left-padded batch keeps its padding at position -1, before the prompt (course.kvcache)
        if not bool(((pos[..., 1:] > pos[..., :-1]) | ~real[..., :-1]).all()):
            raise RuntimeError("SnapKV compresses a prompt once, before any eviction; this cache was already evicted")
        votes = weights.float().sum(dim=2)  # [B, H, S]: attention from the window's queries
        n_prefix = votes.shape[-1] - weights.shape[2]
        pooled = self.pool(votes[..., :n_prefix], None if bool(real.all()) else real[:, :1, :n_prefix])
        stat = layer.stat("snapkv")
        stat[..., :n_prefix] = group_mean(pooled, layer.keys.shape[1])
        stat[..., n_prefix:] = PROTECTED + pos[..., n_prefix:]  # the observation window itself is kept

    def pool(self, votes: Tensor, real: Tensor | None = None) -> Tensor:
        """Pool votes over neighbouring positions: [B, H, S] -> [B, H, S] (stride 1, same size).

        ``real`` ([B, 1, S] bool): in a left-padded batch, which slots hold tokens. Padding then counts as beyond
        the prompt's edge, as if each row ran alone (its votes are zero, which max pooling ignores anyway)."""
        b, h, s = votes.shape
        if s == 0:  # a prompt no longer than the observation window: nothing before it to pool
            return votes
        x = votes.reshape(b * h, 1, s)
        pad = self.kernel // 2
        if self.pooling == "avg" and real is not None:  # the sum over real neighbours / their number
            r = real.expand(b, h, s).reshape(b * h, 1, 1, s).to(x.dtype)
            total = F.avg_pool2d((x * r.view_as(x))[:, :, None], (1, self.kernel), stride=1, padding=(0, pad),
                                 divisor_override=1)
            y = total / F.avg_pool2d(r, (1, self.kernel), stride=1, padding=(0, pad), divisor_override=1)
        elif self.pooling == "avg":
            y = F.avg_pool1d(x, self.kernel, stride=1, padding=pad, count_include_pad=False)
        else:
            y = F.max_pool1d(x, self.kernel, stride=1, padding=pad)
        return y.reshape(b, h, s)

    def scores(self, layer: LayerCache, seen: int) -> Tensor:
        return layer.stat("snapkv")

    @property
    def label(self) -> str:
        return f"snapkv({self.capacity})"

register(PolicyKind(
    "snapkv", lambda budget, sinks, rule, obs_window=8, kernel=7, pooling="max", **o:
    pinned(SnapKV(budget, min(obs_window, budget - 1), kernel, pooling, rule), sinks),
    needs_weights=True, prefill_only=True))
