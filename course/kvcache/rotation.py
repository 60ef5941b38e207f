"""Keys kept rotated where the policy puts them: the part of a cache made with ``rope_theta`` (``KeyRotation``).

A rotated cache keeps every key rotated at ``k_rope + q_pos - q_rope`` (its own position under the policy's rule,
plus the query's offset), so that a query rotated at its original position ``q_pos`` sees it at the policy's
distance ``q_rope - k_rope`` (RoPE scores depend on distances only). That is ``offset`` positions beyond the key's
original position: under positions inside the cache, the number of tokens evicted between the key and the query.
The recent window of StreamingLLM therefore never moves, and its sinks move one position closer at every eviction.
A key is rotated only when its offset changes, each time from its original (``LayerCache.originals``) by its whole
offset, in float32 (float64 for a float64 cache), then cast: never a rotation of a rotation, whose rounding would add
up over the stream in half precision.
"""

from __future__ import annotations

import torch
from torch import Tensor

from course.rope import rope, rope_tables
from course.slots import LayerCache, no_grad

__all__ = ["KeyRotation"]


class KeyRotation:
    """The rotations of one cache's keys with RoPE base ``theta``: the model's queries and new keys (``rotate``, its
    tables computed once per forward) and the cached keys a policy moves (``place``, ``rotate_slots``)."""

    def __init__(self, theta: float) -> None:
        self.theta = theta
        self._tables: tuple | None = None  # (pos, seen, dtype, tables) of the current forward

    def rotate(self, x: Tensor, pos: Tensor, seen: int) -> Tensor:
        """``rope(x, pos, theta)``. Every layer of a forward rotates its queries and keys at the same positions, so
        the cos/sin tables are computed once per forward (kept while ``pos`` is the same tensor and the stream, at
        ``seen`` tokens, has not advanced)."""
        memo = self._tables
        if memo is None or memo[0] is not pos or memo[1] != seen or memo[2] != x.dtype:
            memo = self._tables = (pos, seen, x.dtype, rope_tables(pos, self.theta, x.shape[-1], x.dtype))
        return rope(x, pos, self.theta, memo[3])

    def tables_of(self, offsets: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
        """RoPE's tables for rotating keys by ``offsets`` ([M]), in float32 at least (float64 stays)."""
        return rope_tables(offsets[None, None], self.theta, keys.shape[-1],
                           torch.promote_types(keys.dtype, torch.float32))

    @no_grad
    def place(self, layer: LayerCache, offset: Tensor) -> None:
        """Give every key of a layer the offset ``offset`` ([B, H_kv, S]); padding stays where it is."""
        k_pos = layer.live()[2]
        offset = torch.broadcast_to(offset, k_pos.shape).masked_fill(k_pos < 0, 0)
        moved = (offset != layer.offsets[:, :, : layer.length]).nonzero(as_tuple=True)
        wanted = offset[moved]
        self.rotate_slots(layer, moved, wanted, self.tables_of(wanted, layer.keys))
        layer.placed = True

    @no_grad
    def rotate_slots(self, layer: LayerCache, slots: tuple[Tensor, ...], offsets: Tensor,
                     tables: tuple[Tensor, Tensor]) -> None:
        """Rotate the keys at ``slots`` (indices into [B, H_kv, S]) to ``offsets`` ([M]) beyond their original
        positions, from their originals, with ``tables = tables_of(offsets)``."""
        if slots[0].numel() == 0:
            return
        arrived = layer.originals[slots]  # [M, d] (slots index the storage as well as its live part)
        placed = rope(arrived.to(tables[0].dtype)[None, None], offsets[None, None], self.theta, tables)[0, 0]
        layer.keys[slots] = placed.to(layer.keys.dtype)
        layer.offsets[slots] = offsets
