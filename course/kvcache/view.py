"""What the cache hands a layer: ``AttentionView`` (the keys, values, positions and mask it attends with) and, for
the exact evaluator's chunks, ``SinkRotation``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from torch import Tensor

__all__ = ["AttentionView", "SinkRotation", "Chunks"]

Chunks = Literal["prompt", "stream"]


@dataclass
class SinkRotation:
    """How pinned sinks are rotated when many queries under the cache rule run at once.

    query_positions: [B, T] the position each query takes when it scores a pinned key;
    pinned: [B, H_kv, S] which keys are pinned sinks (rotated with their own position).
    """

    query_positions: Tensor
    pinned: Tensor


@dataclass
class AttentionView:
    """Everything one layer attends with, as the cache and its policy decide (``KVCache.update``).

    keys, values:   [B, H_kv, S, d] every cached slot of the layer; keys *not* rotated, or, in a cache
                    made with ``rope_theta``, already rotated so that a query rotated at its original
                    position sees each key at the policy's distance ``q_rope - k_rope``;
    positions:      [B, H_kv, S] the original position of each slot;
    q_rope, k_rope: the positions RoPE rotates the queries ([B, T]) and keys ([B, H_kv, S]) by,
                    under the policy's position rule (GPT-2, whose positions enter at the input,
                    ignores them); computed when first read (a rotated cache's keys need none);
    sink_rotation:  None, or how pinned sinks are scored in a chunk of the exact evaluator;
    mask:           [B, H_kv, T, S] bool, True where a query may attend; None: every query sees every slot;
    weight_rows:    how many of the last queries' attention weights the policy wants back (``observe``).
    """

    keys: Tensor
    values: Tensor
    positions: Tensor
    mask: Tensor | None
    weight_rows: int
    n_queries: int
    rope_positions: Callable[[], tuple[Tensor, Tensor, SinkRotation | None]] = field(repr=False)
    _rope: tuple[Tensor, Tensor, SinkRotation | None] | None = field(default=None, repr=False)

    def _positions(self) -> tuple[Tensor, Tensor, SinkRotation | None]:
        if self._rope is None:
            self._rope = self.rope_positions()
        return self._rope

    @property
    def q_rope(self) -> Tensor:
        return self._positions()[0]

    @property
    def k_rope(self) -> Tensor:
        return self._positions()[1]

    @property
    def sink_rotation(self) -> SinkRotation | None:
        return self._positions()[2]

    def rows(self, want_weights: bool) -> int:
        """Rows of attention weights to compute: all queries' if the caller wants them, else the policy's."""
        return self.n_queries if want_weights else self.weight_rows
