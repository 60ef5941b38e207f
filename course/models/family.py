"""A model family: what the course knows about one architecture, in one place.

Each family's file (``gpt2.py``, ``llama.py``) defines its readable model and registers one ``Family``: the
transformers ``model_type`` values it loads, how their configs and weights translate into the course's, and
its position rule. Adding a family is one file with a ``register(Family(...))`` and one import in
``course/models/__init__.py``; everything else (``build_model``, ``config_from_hf``, ``from_transformers``,
``ModelConfig.reassigns_positions``) looks the family up here.

This registry sits below the models: it imports none of them (``course.models.base`` reads a family's position
rule from here), so its fields name the model and its configuration by their roles, not their classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

__all__ = ["Family", "FAMILIES", "register", "family", "family_of_hf"]


@dataclass(frozen=True)
class Family:
    name: str  # ModelConfig.family
    model: type[nn.Module]  # the course's readable model, a ``CausalLM`` built from a ``ModelConfig``
    hf_model_types: tuple[str, ...]  # transformers config.model_type values it loads
    config_from_hf: Callable[[Any, str], Any]  # (transformers config, name) -> course ``ModelConfig``
    weights_from_hf: Callable[[dict[str, Tensor], Any], dict[str, Tensor]]  # (state dict, ModelConfig) -> course names
    reassigns_positions: bool  # can a cached token get a new position (RoPE), or is it baked in (learned, at input)?


FAMILIES: dict[str, Family] = {}


def register(f: Family) -> Family:
    """Add a family (once); return it."""
    if f.name in FAMILIES:
        raise ValueError(f"model family {f.name!r} registered twice")
    taken = {t for other in FAMILIES.values() for t in other.hf_model_types} & set(f.hf_model_types)
    if taken:
        raise ValueError(f"model_type(s) {sorted(taken)} already belong to another family")
    FAMILIES[f.name] = f
    return f


def family(name: str) -> Family:
    """The family called ``name`` (a ``ModelConfig.family``)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; the course has {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def family_of_hf(model_type: str) -> Family:
    """The family that loads transformers' ``model_type``; refuses the others by name."""
    for f in FAMILIES.values():
        if model_type in f.hf_model_types:
            return f
    known = ", ".join(t for f in FAMILIES.values() for t in f.hf_model_types)
    raise ValueError(f"model_type {model_type!r} is not supported: the course loads {known}")
