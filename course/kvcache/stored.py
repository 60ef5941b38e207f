"""The cache's side of its store (``course.storage``): when the store rounds, it is called before new tokens arrive,
row by row where the rows of a batch are at different points of their streams (``StoreKeeper``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from course.slots import LayerCache, no_grad
from course.storage.base import Storage

__all__ = ["StoreKeeper"]


class StoreKeeper:
    """One cache's store and, per layer and batch row, how far the store got (``Storage.settle``'s ``done``: for
    KIVI, the position where the next key group starts)."""

    def __init__(self, storage: Storage, n_layers: int, batch: int) -> None:
        self.storage = storage
        self.done = [[0] * batch for _ in range(n_layers)]

    @no_grad
    def settle(self, layer: LayerCache, layer_idx: int, pos: Tensor, rotated: bool,
               moved: Callable[[tuple[Tensor, ...]], None] | None) -> None:
        """The store's rounding before the new tokens at ``pos`` ([B, T], -1: padding) arrive, row by row at each
        row's first new position (the rows of a left-padded batch are at different positions of their streams), so
        that every row is stored as it would be alone. ``rotated``: the cache holds keys rotated at their original
        positions. In a cache whose policy moves rotated keys (``originals``), the keys are rounded as they arrived
        and ``moved(slots)`` places each rounded key again from there: a key the policy moves later moves rounded."""
        keys, values, k_pos = layer.live()
        arrived = None if layer.originals is None else layer.originals[:, :, : layer.length]
        stat = None if self.storage.slot_stat is None else layer.stat(self.storage.slot_stat)
        firsts = pos.masked_fill(pos < 0, torch.iinfo(pos.dtype).max).amin(dim=1).tolist()  # [B]
        done = self.done[layer_idx]
        together = len(set(zip(firsts, done))) == 1  # every row at the same point of its stream: one call
        for rows in ([slice(0, len(firsts))] if together else [slice(b, b + 1) for b in range(len(firsts))]):
            first, before = firsts[rows.start], done[rows.start]
            if first == torch.iinfo(pos.dtype).max:  # a row of padding only
                continue
            settled = self.storage.settle((keys if arrived is None else arrived)[rows], values[rows], k_pos[rows],
                                          None if stat is None else stat[rows], before, first, rotated=rotated)
            if arrived is not None and settled > before and moved is not None:
                rounded = ((k_pos[rows] >= before) & (k_pos[rows] < settled)).nonzero(as_tuple=True)
                moved((rounded[0] + rows.start, *rounded[1:]))
            done[rows] = [settled] * len(done[rows])

    def select_rows(self, rows: list[int]) -> None:
        """Keep the batch rows ``rows`` (repeats allowed), in that order."""
        self.done = [[done[i] for i in rows] for done in self.done]

    def nbytes(self, layers: list[LayerCache], dtype_bytes: int) -> int:
        """Bytes of every layer's keys and values in use as the store holds them (``Storage.nbytes``)."""
        return sum(self.storage.nbytes(layer, dtype_bytes) for layer in layers)
