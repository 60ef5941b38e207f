"""The KV cache: what a decoder keeps so that it never recomputes the past.

Every layer stores, for every token it has seen and not evicted, one key and one value
vector per KV head, together with the token's *original* position in the stream:

    keys[l], values[l] : [batch, kv_heads, slots, head_dim]
    positions[l]       : [batch, kv_heads, slots]          (original position of each slot)

Storage is preallocated and grows by doubling, so appending a token never copies the whole
cache (no ``torch.cat`` per step). When a budgeted policy is full, the new token is written
*into the slot of the evicted one* (per batch row and KV head: H2O and SnapKV keep different
tokens in different heads). Attention is permutation invariant over keys as long as each key
carries its position, so slot order does not matter.

Keys are stored before any rotary embedding, so the model can give cached keys new
positions (StreamingLLM's position re-assignment, see ``rope_positions``).

The memory a cache costs is 2 (K and V) x layers x kv_heads x head_dim x tokens x bytes:
``nbytes`` reports it for the slots in use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from course.policies import Policy

__all__ = ["LayerCache", "KVCache", "SinkRotation", "cache_bytes_per_token"]


def cache_bytes_per_token(n_layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """Bytes one token occupies in the cache: 2 (K and V) * L * H_kv * d * bytes per number."""
    return 2 * n_layers * kv_heads * head_dim * dtype_bytes


def _storage(shape: tuple[int, ...], fill: float, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """Cache storage: a plain tensor even when made under ``torch.inference_mode`` (so that the
    cache can be updated in place later, inside or outside inference mode)."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.full(shape, fill, dtype=dtype, device=device)


@dataclass
class SinkRotation:
    """How pinned sinks are rotated when many queries under the cache rule run at once.

    query_positions: [B, T] the position each query takes when it scores a pinned key;
    pinned: [B, H_kv, S] which keys are pinned sinks (rotated with their own position).
    """

    query_positions: Tensor
    pinned: Tensor


@dataclass
class LayerCache:
    """The keys, values and positions of one layer, in preallocated slots.

    Only the first ``length`` slots are in use. ``stats`` holds per-slot numbers that a
    policy keeps (e.g. H2O's accumulated attention); they move with their slot when the
    cache grows, overwrites or gathers, and start at zero for a new token.
    """

    keys: Tensor  # [B, H_kv, capacity, d]
    values: Tensor  # [B, H_kv, capacity, d]
    positions: Tensor  # [B, H_kv, capacity] long; -1 where unused
    length: int = 0
    stats: dict[str, Tensor] = field(default_factory=dict)  # name -> [B, H_kv, capacity]
    max_capacity: int | None = None  # doubling stops here (a budgeted cache: budget + 1), unless more are needed

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def live(self) -> tuple[Tensor, Tensor, Tensor]:
        """Views of the slots in use: keys/values [B, H_kv, length, d], positions [B, H_kv, length]."""
        n = self.length
        return self.keys[:, :, :n], self.values[:, :, :n], self.positions[:, :, :n]

    def stat(self, name: str) -> Tensor:
        """The per-slot statistic ``name`` ([B, H_kv, length], float32), created at zero."""
        if name not in self.stats:
            self.stats[name] = _storage(self.positions.shape, 0.0, torch.float32, self.keys.device)
        return self.stats[name][:, :, : self.length]

    def _reserve(self, needed: int) -> None:
        """Grow storage (doubling) so that ``needed`` slots fit."""
        if needed <= self.capacity:
            return
        new_cap = max(2 * self.capacity, 16)
        if self.max_capacity is not None:
            new_cap = min(new_cap, self.max_capacity)
        new_cap = max(needed, new_cap)

        def grow(t: Tensor, fill: float) -> Tensor:
            out = _storage((*t.shape[:2], new_cap, *t.shape[3:]), fill, t.dtype, t.device)
            out[:, :, : self.length] = t[:, :, : self.length]
            return out

        self.keys, self.values = grow(self.keys, 0.0), grow(self.values, 0.0)
        self.positions = grow(self.positions, -1)
        self.stats = {k: grow(v, 0.0) for k, v in self.stats.items()}

    @torch.no_grad()
    def append(self, k: Tensor, v: Tensor, pos: Tensor) -> None:
        """Write T new tokens after the last slot. k, v: [B, H_kv, T, d]; pos: [B, T]."""
        t = k.shape[2]
        self._reserve(self.length + t)
        sl = slice(self.length, self.length + t)
        self.keys[:, :, sl] = k
        self.values[:, :, sl] = v
        self.positions[:, :, sl] = pos[:, None, :]
        for s in self.stats.values():
            s[:, :, sl] = 0.0
        self.length += t

    @torch.no_grad()
    def overwrite(self, slot: Tensor, k: Tensor, v: Tensor, pos: Tensor) -> None:
        """Write one new token into the given slot of every (batch, head), evicting its occupant.

        slot: [B, H_kv] long; k, v: [B, H_kv, 1, d]; pos: [B, 1].
        """
        idx = slot[:, :, None, None].expand(-1, -1, 1, k.shape[-1])
        self.keys.scatter_(2, idx, k)
        self.values.scatter_(2, idx, v)
        self.positions.scatter_(2, slot[:, :, None], pos[:, None, :].expand(-1, slot.shape[1], -1))
        for s in self.stats.values():
            s.scatter_(2, slot[:, :, None], 0.0)

    @torch.no_grad()
    def gather(self, index: Tensor) -> None:
        """Keep only the slots in ``index`` ([B, H_kv, K] long), in that order, in place."""
        k = index.shape[-1]
        idx = index[..., None].expand(-1, -1, -1, self.keys.shape[-1])
        self.keys[:, :, :k] = self.keys[:, :, : self.length].gather(2, idx)
        self.values[:, :, :k] = self.values[:, :, : self.length].gather(2, idx)
        self.positions[:, :, :k] = self.positions[:, :, : self.length].gather(2, index)
        for s in self.stats.values():
            s[:, :, :k] = s[:, :, : self.length].gather(2, index)
        self.positions[:, :, k:] = -1
        self.length = k


class KVCache:
    """The whole model's cache: one ``LayerCache`` per layer plus the policy that manages it.

    Create it with ``model.new_cache(batch, policy)``, which fills in the shapes. ``seen`` is
    the number of tokens of the stream processed so far: the next token's original position.
    """

    def __init__(
        self,
        n_layers: int,
        batch: int,
        kv_heads: int,
        head_dim: int,
        *,
        policy: Policy | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        capacity: int = 64,
        max_tokens: int | None = None,
    ) -> None:
        from course.policies import FullCache  # local import: policies imports this module

        if min(n_layers, batch, kv_heads, head_dim) < 1:
            raise ValueError(
                f"KVCache needs n_layers, batch, kv_heads, head_dim >= 1, got "
                f"{n_layers}, {batch}, {kv_heads}, {head_dim}"
            )
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1 (or None), got {max_tokens!r}")
        self.policy: Policy = policy if policy is not None else FullCache()
        # Allocate for min(budget, tokens that can exist): a budgeted cache starts at most at
        # ``capacity`` slots (or ``max_tokens``, the most the caller will feed) and doubles up to
        # budget + 1, so a budget far above the stream's length costs no memory.
        limit = None if self.policy.budget is None else self.policy.budget + 1
        if max_tokens is not None:
            capacity = max_tokens
        if limit is not None:
            capacity = min(capacity, limit)
        self.shape = (n_layers, batch, kv_heads, head_dim)
        self.dtype = dtype
        self.layers = [
            LayerCache(
                keys=_storage((batch, kv_heads, capacity, head_dim), 0.0, dtype, device),
                values=_storage((batch, kv_heads, capacity, head_dim), 0.0, dtype, device),
                positions=_storage((batch, kv_heads, capacity), -1, torch.long, device),
                max_capacity=limit,
            )
            for _ in range(n_layers)
        ]
        self.seen = 0

    # ----------------------------------------------------------------------------- writing
    def update(self, layer_idx: int, k: Tensor, v: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Store the new tokens' K/V and return everything the layer may attend to.

        k, v: [B, H_kv, T, d] (keys not yet rotated); pos: [B, T] original positions.
        Returns keys, values [B, H_kv, S, d] and their original positions [B, H_kv, S].

        A single new token (decode) that finds the cache at its budget takes the slot of the
        policy's victim, so the token attends to exactly ``budget`` keys, its own included.
        Several new tokens (a prompt, or a chunk of the exact evaluator) are appended; the
        caller then calls ``compress`` to come back to the budget.
        """
        layer = self.layers[layer_idx]
        if k.shape[0] != self.shape[1] or k.shape[1] != self.shape[2] or k.shape[3] != self.shape[3]:
            raise ValueError(
                f"this cache holds [batch={self.shape[1]}, kv_heads={self.shape[2]}, head_dim={self.shape[3]}] "
                f"but layer {layer_idx} gave keys of shape {tuple(k.shape)}: was it made by another model?"
            )
        budget = self.policy.budget
        if k.shape[2] == 1 and budget is not None and layer.length >= budget:
            victim = self.policy.scores(layer, self.seen).argmin(dim=-1)  # [B, H_kv]
            layer.overwrite(victim, k, v, pos)
        else:
            layer.append(k, v, pos)
        return layer.live()

    def advance(self, n_tokens: int) -> None:
        """Called by the model once all layers have processed ``n_tokens`` new tokens."""
        self.seen += n_tokens

    def compress(self, budget: int | None = None) -> None:
        """Evict down to ``budget`` slots (default: the policy's) in every layer, keeping the best scored."""
        budget = self.policy.prompt_budget if budget is None else budget
        if budget is None:
            return
        for layer in self.layers:
            if layer.length > budget:
                scores = self.policy.scores(layer, self.seen)
                keep = scores.topk(budget, dim=-1).indices.sort(dim=-1).values
                layer.gather(keep)

    # ----------------------------------------------------------------------------- reading
    def rope_positions(self, layer_idx: int, q_pos: Tensor) -> tuple[Tensor, Tensor, SinkRotation | None]:
        """Positions the rotary embedding should use for the queries and the cached keys.

        Original rule: the true positions. Cache rule (StreamingLLM): a key's position is its
        rank among the cached keys (0..n-1) and each new query takes the rank of its own slot.

        One exception keeps the exact chunked evaluator exact under the cache rule: when several
        queries beyond the budget run at once under a position-only policy, each query saw a
        different cache. Recent keys sit at their true distance from the query in every such
        cache; only the pinned sinks appear closer than they really are, as if the query stood
        at position ``budget - 1``. That case returns true positions plus a ``SinkRotation``.
        Returns (q_positions [B, T], k_positions [B, H_kv, S], SinkRotation or None).
        """
        _, _, k_pos = self.layers[layer_idx].live()
        if self.policy.position_rule == "original":
            return q_pos, k_pos, None
        n, t = k_pos.shape[-1], q_pos.shape[-1]
        budget = self.policy.budget
        if t > 1 and self.policy.is_static and budget is not None and n > budget:
            return q_pos, k_pos, SinkRotation(q_pos.clamp(max=budget - 1), self.policy.pinned(k_pos))
        ranks = k_pos.argsort(dim=-1).argsort(dim=-1)
        q_rank = torch.arange(n - t, n, device=q_pos.device).expand(q_pos.shape[0], t)
        return q_rank, ranks, None

    def attention_mask(self, layer_idx: int, q_pos: Tensor) -> Tensor | None:
        """Which cached keys each query may see: [B, H_kv, T, S] bool, or None when all may.

        Causal by original position, and, for policies whose choice depends only on positions,
        restricted to the keys that would still be cached when that query was decoded alone.
        """
        if q_pos.shape[-1] == 1:
            return None
        _, _, k_pos = self.layers[layer_idx].live()
        qp = q_pos[:, None, :, None]
        kp = k_pos[:, :, None, :]
        mask = kp <= qp
        if self.policy.is_static:
            mask = mask & self.policy.visible(qp, kp)
        return mask

    # ----------------------------------------------------------------------------- sizes
    @property
    def n_slots(self) -> int:
        """Slots in use in the fullest layer (tokens cached per KV head)."""
        return max(layer.length for layer in self.layers)

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values in use: 2 * L * B * H_kv * d * slots * bytes per number."""
        elt = torch.finfo(self.dtype).bits // 8
        _, b, h, d = self.shape
        return sum(2 * b * h * d * layer.length * elt for layer in self.layers)

    @property
    def allocated_bytes(self) -> int:
        """Bytes the preallocated key/value storage occupies (>= nbytes)."""
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.layers)

    def positions(self, layer_idx: int = 0) -> Tensor:
        """Original positions cached in a layer: [B, H_kv, S]."""
        return self.layers[layer_idx].live()[2]

    def __repr__(self) -> str:
        n, b, h, d = self.shape
        return (
            f"KVCache(layers={n}, batch={b}, kv_heads={h}, head_dim={d}, slots={self.n_slots}, "
            f"seen={self.seen}, policy={self.policy!r}, {self.nbytes / 2**20:.2f} MiB)"
        )
