"""What a cache holds and costs, and the set-up for measurements (``Inspection``, a part of ``KVCache``): its slots
and bytes, its positions, and putting it into a given state (``fill``) or back to an earlier one (``rewind``).

The memory a cache costs is 2 (K and V) x layers x kv_heads x head_dim x tokens x bytes (``cache_bytes_per_token``,
the one formula the course uses) in full precision; ``nbytes`` asks the cache's store (``course.storage``), which
counts what it holds for the slots in use.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["Inspection"]


class Inspection:
    """``KVCache``'s sizes and measurement set-up (it reads the cache's ``layers``, ``policy``, ``storage``,
    ``shape``, ``dtype`` and ``seen``)."""

    # ----------------------------------------------------------------------------- set-up for measurements
    @torch.no_grad()
    def fill(self, keys: Tensor, values: Tensor, positions: Tensor, seen: int,
             stats: dict[str, Tensor] | None = None) -> None:
        """Put every layer into a given state (benchmarks: the cost of a step depends on the slots, not
        on what they hold). keys, values: [B, H_kv, S, d]; positions: [B, S] original positions;
        ``seen``: tokens streamed so far; stats: optional per-slot numbers of the policy, name -> [B, H_kv, S]."""
        if any(layer.length for layer in self.layers):
            raise ValueError("fill needs an empty cache")
        if positions.shape[-1] and int(positions.max()) >= seen:
            raise ValueError(f"positions must be below seen={seen}, got up to {int(positions.max())}")
        for layer in self.layers:
            layer.append(keys.to(self.dtype), values.to(self.dtype), positions)
            for name, value in (stats or {}).items():
                layer.stat(name)[:] = value
        self.seen = seen
        for layer in self.layers:
            if layer.originals is not None:  # the keys count as arrived: placed where the policy puts them
                self._place(layer, self._offsets_after(layer))

    @torch.no_grad()
    def rewind(self, seen: int) -> None:
        """Forget every token from position ``seen`` on (timing one step again and again at one context).

        Only for caches that never evict (no budget): their slots are in stream order."""
        if self.policy.budget is not None or self.policy.prompt_budget is not None:
            raise ValueError(f"rewind needs a cache that never evicts; this one runs {self.policy.label}")
        if self.storage.rounds:
            raise ValueError("rewind needs a cache in full precision: a quantized store has already rounded its tokens")
        if not 0 <= seen <= self.seen:
            raise ValueError(f"seen must be between 0 and {self.seen}, got {seen}")
        for layer in self.layers:
            layer.length = int((layer.positions[0, 0, : layer.length] < seen).sum())
            layer.positions[:, :, layer.length :] = -1
        self.seen = seen

    # ----------------------------------------------------------------------------- sizes
    @property
    def n_slots(self) -> int:
        """Slots in use in the fullest layer (tokens cached per KV head)."""
        return max(layer.length for layer in self.layers)

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values in use, at the cache's dtype (``bytes_at``)."""
        return self.bytes_at(torch.finfo(self.dtype).bits // 8)

    def bytes_at(self, dtype_bytes: int) -> int:
        """Bytes of keys and values in use if full-precision numbers took ``dtype_bytes`` each (e.g. 2: what a
        16-bit deployment holds, whatever the dtype this cache computes in), as the store counts them
        (``Storage.nbytes``): in full precision ``cache_bytes_per_token`` per slot of each layer and batch row; a
        quantized store its codes, scales and full-precision tokens (``KIVI.nbytes``)."""
        return self._store.nbytes(self.layers, dtype_bytes)

    @property
    def allocated_bytes(self) -> int:
        """Bytes the preallocated key/value storage occupies (>= nbytes), with the arrived keys a re-rotating
        cache keeps beside its keys."""
        return sum(layer.keys.nbytes + layer.values.nbytes + (0 if layer.originals is None else layer.originals.nbytes)
                   for layer in self.layers)

    def positions(self, layer_idx: int = 0) -> Tensor:
        """Original positions cached in a layer: [B, H_kv, S]."""
        return self.layers[layer_idx].live()[2]

    def __repr__(self) -> str:
        n, b, h, d = self.shape
        return (
            f"KVCache(layers={n}, batch={b}, kv_heads={h}, head_dim={d}, slots={self.n_slots}, "
            f"seen={self.seen}, policy={self.policy!r}, {self.nbytes / 2**20:.2f} MiB)"
        )
