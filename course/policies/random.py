"""Random eviction: the floor any policy should beat."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from course.policies.base import Policy, PositionRule, check_int, check_rule
from course.policies.registry import PolicyKind, register
from course.policies.sinks import pinned

if TYPE_CHECKING:  # pragma: no cover
    from course.slots import LayerCache

__all__ = ["RandomEviction"]


class RandomEviction(Policy):
    """Evict a uniformly random slot: the floor any policy should beat."""

    name = "random"

    def __init__(self, budget: int, seed: int = 0, positions: PositionRule = "original") -> None:
        self.budget = check_int("budget", budget, 1)
        self.position_rule = check_rule(positions)
        self.generator = torch.Generator().manual_seed(seed)

    def scores(self, layer: LayerCache, seen: int) -> Tensor:
        shape = layer.positions[:, :, : layer.length].shape
        return torch.rand(shape, generator=self.generator).to(layer.keys.device)

    @property
    def label(self) -> str:
        return f"random({self.budget})"

register(PolicyKind(
    "random", lambda budget, sinks, rule, seed=0, **o: pinned(RandomEviction(budget, seed, rule), sinks),
    shown_in=frozenset()))
