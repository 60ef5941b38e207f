"""KIVI with its keys rounded after the rotary embedding, as the KIVI paper and its code do.

``KIVI`` rounds keys as the cache holds them. The course's readable path caches keys before rotation, so there KIVI
rounds them before RoPE (as KVQuant does, where outlier channels stay put); this store rounds every key group as the
keys are rotated at their original positions, whatever the cache: in a cache of keys before rotation it rotates a
group's keys, rounds them per channel, and stores them rotated back (so the model, rotating them again, attends with
the rounded rotated keys); in a cache of rotated keys it is ``KIVI`` itself. The values and the byte count are KIVI's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from course.rope import rope
from course.storage.base import register_storage
from course.storage.kivi import KIVI
from course.storage.rounding import wide

__all__ = ["KIVIPostRoPE"]


@register_storage
@dataclass(frozen=True)
class KIVIPostRoPE(KIVI):
    """``KIVI`` with keys rounded after rotation. ``rope_theta``: the RoPE base of the model whose keys it stores
    (None: a model without rotation, such as GPT-2, where it is ``KIVI``)."""

    rope_theta: float | None = 10000.0

    name = "kivi-post-rope"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rope_theta is not None and not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be positive (or None: no rotation), got {self.rope_theta!r}")

    @property
    def label(self) -> str:
        return f"{super().label} post-RoPE"

    @torch.no_grad()
    def settle(self, keys: Tensor, values: Tensor, positions: Tensor, group_id: Tensor, done: int,
               next_position: int, *, rotated: bool = False) -> int:
        """``KIVI.settle`` on the keys rotated at their original positions ([B, H_kv, S] ``positions``); the rounded
        keys are stored rotated back (the exact sinks and every key not rounded now stay as they were)."""
        if rotated or self.rope_theta is None:
            return super().settle(keys, values, positions, group_id, done, next_position, rotated=rotated)
        turned = rope(keys.to(wide(keys.dtype)), positions, self.rope_theta)  # [B, H_kv, S, d]
        settled = super().settle(turned, values, positions, group_id, done, next_position, rotated=True)
        if settled > done:
            now = (positions >= max(done, self.exact_sinks)) & (positions < settled)  # [B, H_kv, S]
            back = rope(turned, -positions, self.rope_theta).to(keys.dtype)
            keys.copy_(torch.where(now[..., None], back, keys))
        return settled
