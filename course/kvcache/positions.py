"""The position rules, as the cache applies them for a layer: the RoPE positions of queries and cached keys, and
which cached keys each query of a chunk may see. Functions of the policy and the slots' original positions."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from course.kvcache.view import SinkRotation

if TYPE_CHECKING:  # pragma: no cover
    from course.policies.base import Policy

__all__ = ["rope_positions", "attention_mask"]


def rope_positions(policy: Policy, streamed: bool, k_pos: Tensor,
                   q_pos: Tensor) -> tuple[Tensor, Tensor, SinkRotation | None]:
    """Positions the rotary embedding should use for the queries at ``q_pos`` ([B, T]) and the cached keys at
    ``k_pos`` ([B, H_kv, S]); ``streamed``: chunks of several tokens stand for a stream (``KVCache._streamed``).

    Original rule: the true positions. Cache rule (StreamingLLM): a key's position is its
    rank among the cached keys (0..n-1) and each new query takes the rank of its own slot.

    One exception keeps the exact chunked evaluator exact under the cache rule: when several
    queries beyond the budget run at once as a stream chunk under a position-only policy, each
    query saw a different cache. Recent keys sit at their true distance from the query in every
    such cache; only the pinned sinks appear closer than they really are, as if the query stood
    at position ``budget - 1``. That case returns true positions plus a ``SinkRotation``.
    Returns (q_positions [B, T], k_positions [B, H_kv, S], SinkRotation or None).
    """
    if policy.position_rule == "original":
        return q_pos, k_pos, None
    n, t = k_pos.shape[-1], q_pos.shape[-1]
    budget = policy.budget
    if t > 1 and streamed and budget is not None and n > budget:
        return q_pos, k_pos, SinkRotation(q_pos.clamp(max=budget - 1), policy.pinned(k_pos))
    ranks = policy.cache_ranks(k_pos)
    q_rank = torch.arange(n - t, n, device=q_pos.device).expand(q_pos.shape[0], t)
    return q_rank, ranks, None


def attention_mask(policy: Policy, streamed: bool, k_pos: Tensor, q_pos: Tensor) -> Tensor | None:
    """Which cached keys each query may see: [B, H_kv, T, S] bool, or None when all may.

    Causal by original position; for a stream chunk under a policy decided by positions alone (``streamed``),
    also restricted to the keys that would still be cached when that query was decoded alone.
    """
    if q_pos.shape[-1] == 1:
        return None
    qp = q_pos[:, None, :, None]
    kp = k_pos[:, :, None, :]
    mask = kp <= qp
    if streamed:
        mask = mask & policy.visible(qp, kp)
    return mask
