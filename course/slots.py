"""The bottom of the cache: one layer's keys, values and positions in preallocated slots (``LayerCache``).

Every layer stores, for every token it has seen and not evicted, one key and one value vector per KV head,
together with the token's *original* position in the stream:

    keys, values : [batch, kv_heads, slots, head_dim]
    positions    : [batch, kv_heads, slots]          (original position of each slot; -1 unused or padding)

Storage is preallocated and grows by doubling, so appending a token never copies the whole layer (no
``torch.cat`` per step). A new token can be written *into the slot of an evicted one* (``overwrite``), per batch row
and KV head. Attention is permutation invariant over keys as long as each key carries its position, so slot order
does not matter.

This module is the floor the rest stands on: the policies (which slots survive, ``course.policies``), the stores
(how the kept numbers are held, ``course.storage``) and the cache that composes them (``course.kvcache``) all read
``LayerCache``; it imports nothing of the course.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["LayerCache", "allocate", "no_grad"]


def no_grad(fn):
    """``torch.no_grad()`` for the cache's writes, skipped where gradients are off already (decoding runs under
    ``torch.inference_mode``): a decorator's cost, paid by every layer at every step, is not negligible there."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not torch.is_grad_enabled():
            return fn(*args, **kwargs)
        with torch.no_grad():
            return fn(*args, **kwargs)

    return wrapper


def allocate(shape: tuple[int, ...], fill: float, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """Cache storage: a plain tensor even when made under ``torch.inference_mode`` (so that the
    cache can be updated in place later, inside or outside inference mode)."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.full(shape, fill, dtype=dtype, device=device)


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
    # Only in a cache that re-rotates keys (``rope_theta`` and positions inside the cache): each key as it arrived,
    # and how far (in positions) the key in ``keys`` is rotated beyond it. They move with their slot.
    originals: Tensor | None = None  # [B, H_kv, capacity, d]
    offsets: Tensor | None = None  # [B, H_kv, capacity] long
    # False after slots were gathered from outside the cache's own updates: the layer then makes its own eviction
    # choices (never one shared with other layers), and a rotated cache places its keys afresh at the next update.
    placed: bool = True

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
            self.stats[name] = allocate(self.positions.shape, 0.0, torch.float32, self.keys.device)
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
            out = allocate((*t.shape[:2], new_cap, *t.shape[3:]), fill, t.dtype, t.device)
            out[:, :, : self.length] = t[:, :, : self.length]
            return out

        self.keys, self.values = grow(self.keys, 0.0), grow(self.values, 0.0)
        self.positions = grow(self.positions, -1)
        self.stats = {k: grow(v, 0.0) for k, v in self.stats.items()}
        if self.originals is not None:
            self.originals, self.offsets = grow(self.originals, 0.0), grow(self.offsets, 0)

    @no_grad
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
        if self.originals is not None:
            self.originals[:, :, sl] = k
            self.offsets[:, :, sl] = 0
        self.length += t

    @no_grad
    def overwrite(self, slot: Tensor, k: Tensor, v: Tensor, pos: Tensor) -> None:
        """Write one new token into the given slot of every (batch, head), evicting its occupant.

        slot: [B, H_kv] long; k, v: [B, H_kv, 1, d]; pos: [B, 1].
        """
        one = slot[:, :, None]  # [B, H_kv, 1]
        idx = one[..., None].expand(-1, -1, 1, k.shape[-1])
        self.keys.scatter_(2, idx, k)
        self.values.scatter_(2, idx, v)
        self.positions.scatter_(2, one, pos[:, None, :].expand(-1, slot.shape[1], -1))
        for s in self.stats.values():
            s.scatter_(2, one, 0.0)
        if self.originals is not None:
            self.originals.scatter_(2, idx, k)
            self.offsets.scatter_(2, one, 0)

    @no_grad
    def gather(self, index: Tensor) -> None:
        """Keep only the slots in ``index`` ([B, H_kv, K] long), in that order, in place."""
        k = index.shape[-1]
        idx = index[..., None].expand(-1, -1, -1, self.keys.shape[-1])
        self.keys[:, :, :k] = self.keys[:, :, : self.length].gather(2, idx)
        self.values[:, :, :k] = self.values[:, :, : self.length].gather(2, idx)
        self.positions[:, :, :k] = self.positions[:, :, : self.length].gather(2, index)
        for s in self.stats.values():
            s[:, :, :k] = s[:, :, : self.length].gather(2, index)
        if self.originals is not None:
            self.originals[:, :, :k] = self.originals[:, :, : self.length].gather(2, idx)
            self.offsets[:, :, :k] = self.offsets[:, :, : self.length].gather(2, index)
        self.positions[:, :, k:] = -1
        self.length = k
        self.placed = False  # (the kept keys have new ranks)

    @no_grad
    def select_rows(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` ([B'] long), in that order (beam search reorders its beams so)."""
        self.keys, self.values = self.keys.index_select(0, index), self.values.index_select(0, index)
        self.positions = self.positions.index_select(0, index)
        self.stats = {k: v.index_select(0, index) for k, v in self.stats.items()}
        if self.originals is not None:
            self.originals, self.offsets = self.originals.index_select(0, index), self.offsets.index_select(0, index)
