"""The full cache: keep everything (the dense baseline)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from course.policies.base import Policy
from course.policies.registry import PolicyKind, register

if TYPE_CHECKING:  # pragma: no cover
    from course.slots import LayerCache

__all__ = ["FullCache"]


class FullCache(Policy):
    """Keep everything: the dense baseline. Memory grows with every token."""

    name = "full"
    is_static = True

    def scores(self, layer: LayerCache, seen: int) -> Tensor:
        return layer.positions[:, :, : layer.length].float()  # (never called: no budget)

    def visible(self, q_pos: Tensor, k_pos: Tensor, slots: int | None = None) -> Tensor:
        if slots is None:
            return torch.ones_like(k_pos, dtype=torch.bool) & torch.ones_like(q_pos, dtype=torch.bool)
        return q_pos - k_pos < slots

register(PolicyKind("full", lambda budget, sinks, rule, **o: FullCache(), bounded=False,
                    shown_in=frozenset({"bench"})))
