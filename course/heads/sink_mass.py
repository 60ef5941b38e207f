"""Sinks and head types: how much of each head's attention rests on the first token.

Notebook 02 measured sink mass per layer and head; here it is set beside the retrieval score, to ask whether the
heads that keep only sinks + a window (DuoAttention's streaming heads) are the heads that carry the sink mass.
"""

from __future__ import annotations

from torch import Tensor

from course.attention_analysis import attention_maps, sink_mass
from course.models.base import CausalLM

__all__ = ["head_sink_mass"]


def head_sink_mass(model: CausalLM, ids: Tensor, k: int = 1) -> Tensor:
    """Mean attention mass on the first ``k`` tokens of every query head for a plain forward over ``ids`` ([T] or
    [B, T]): [layers, heads] (``course.attention_analysis.sink_mass``: queries before 4·k left out)."""
    return sink_mass(attention_maps(model, ids), k)
