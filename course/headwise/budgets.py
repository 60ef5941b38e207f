"""Budgets that differ by layer or by head, on SnapKV's scores: PyramidKV's schedule over layers
(``pyramid_budgets``, ``pyramid_kv``) and Ada-KV's allocation over a layer's heads (``adakv_counts``, ``ada_kv``).

Budgets count slots per KV head, as everywhere in the course; the observation window is part of them.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from course.headwise.plan import HeadPlan, HeadwisePolicy, Part
from course.policies import SnapKV
from course.policies.base import check_int

__all__ = ["pyramid_budgets", "pyramid_kv", "adakv_keep", "adakv_counts", "ada_kv"]


def pyramid_budgets(n_layers: int, budget: int, obs_window: int = 8, beta: float = 20) -> list[int]:
    """PyramidKV's per-layer budgets (Cai et al. 2024, arXiv 2406.02069, Sec. 3, as kvpress's
    ``PyramidKVPress.get_layer_budget`` computes them): an arithmetic sequence from the first layer's
    ``2 budget - budget / beta`` down to the last layer's ``budget / beta``, whose mean is ``budget``.

    As in kvpress, when the last layer would keep fewer than ``obs_window`` slots (``budget / beta < obs_window``)
    every layer keeps ``budget`` (SnapKV's uniform budget). Unlike kvpress, which rounds each layer on its own, the
    budgets sum to exactly ``n_layers * budget``: each layer gets the floor of its share and the slots left go to
    the layers with the largest fractions (the shallower first between equals). kvpress also clamps the first
    layer to the prompt's length, which this schedule, made before any prompt, does not know."""
    check_int("n_layers", n_layers, 1)
    check_int("budget", budget, 1)
    check_int("obs_window", obs_window, 1)
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta >= 1:
        raise ValueError(f"beta must be a number >= 1 (the ratio of the mean budget to the last layer's), got {beta!r}")
    smallest = budget / beta
    if n_layers == 1 or smallest < obs_window:
        return [budget] * n_layers
    largest = 2 * budget - smallest
    step = (largest - smallest) / (n_layers - 1)
    shares = [round(largest - i * step, 9) for i in range(n_layers)]  # (round off the float noise of the steps)
    out = [math.floor(s) for s in shares]
    left = n_layers * budget - sum(out)
    for i in sorted(range(n_layers), key=lambda i: (-(shares[i] - out[i]), i))[:left]:
        out[i] += 1
    return out


def pyramid_kv(config, budget: int, *, obs_window: int = 8, kernel: int = 7, beta: float = 20) -> HeadwisePolicy:
    """SnapKV in every layer with PyramidKV's budgets (``pyramid_budgets``): ``config.n_layer * budget`` slots per
    KV head in all, more in the shallow layers. ``config``: the model's ``ModelConfig``."""
    budgets = pyramid_budgets(config.n_layer, budget, obs_window, beta)
    heads = tuple(range(config.n_kv_head))
    layers = [(Part(heads, SnapKV(b, min(obs_window, b - 1), kernel)),) for b in budgets]
    return HeadwisePolicy(HeadPlan(tuple(layers), config.n_kv_head), f"pyramidkv({budget})")


def _check_scores(scores: Tensor, budget: int, safeguard: float) -> None:
    if not isinstance(scores, Tensor) or scores.dim() != 3:
        raise ValueError(f"scores must be a [batch, kv_heads, slots] tensor, got "
                         f"{tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__}")
    check_int("budget", budget, 1)
    if isinstance(safeguard, bool) or not isinstance(safeguard, (int, float)) or not 0 <= safeguard <= 1:
        raise ValueError(f"safeguard must be a number between 0 and 1 (the share of each head's budget it keeps "
                         f"whatever the others score), got {safeguard!r}")


def adakv_keep(scores: Tensor, budget: int, safeguard: float = 0.2) -> Tensor:
    """Ada-KV's allocation over one layer's heads (Feng et al. 2024, arXiv 2407.11550, Alg. 1, with the safeguard
    of its Sec. 4; kvpress's ``AdaKVPress``): which slots each head keeps, [B, H_kv, S] bool.

    scores: [B, H_kv, S] keep-priorities (SnapKV's pooled votes). Each head first keeps its
    ``max(1, int(budget * safeguard))`` best slots; the layer's other ``H_kv * budget`` minus those go to the best
    scores over all heads together (one top-k instead of one per head). Exactly ``H_kv * budget`` slots per row when
    every head has more than ``budget`` (else nothing is dropped)."""
    _check_scores(scores, budget, safeguard)
    b, h, s = scores.shape
    if s <= budget:
        return torch.ones_like(scores, dtype=torch.bool)
    safe = scores.topk(max(1, int(budget * safeguard)), dim=-1).indices
    boosted = scores.float().scatter(-1, safe, math.inf)  # the safeguard: each head's best come first
    chosen = boosted.reshape(b, h * s).topk(h * budget, dim=-1).indices  # one top-k over the layer's heads
    keep = torch.zeros(b, h * s, dtype=torch.bool, device=scores.device)
    return keep.scatter_(1, chosen, True).reshape(b, h, s)


def adakv_counts(scores: Tensor, budget: int, safeguard: float = 0.2) -> Tensor:
    """Slots each head keeps under Ada-KV's allocation (``adakv_keep``): [B, H_kv] long, summing to
    ``H_kv * budget`` per row."""
    return adakv_keep(scores, budget, safeguard).sum(dim=-1)


def ada_kv(config, budget: int, *, safeguard: float = 0.2, obs_window: int = 8, kernel: int = 7) -> HeadwisePolicy:
    """SnapKV's scores with Ada-KV's budgets: each layer keeps ``H_kv * budget`` slots, shared among its KV heads
    by one top-k over their scores (``adakv_keep``) when the prompt is compressed. ``config``: the model's
    ``ModelConfig``. One prompt at a time (batch 1)."""
    check_int("budget", budget, 2)
    _check_scores(torch.zeros(1, 1, 1), budget, safeguard)
    heads = tuple(range(config.n_kv_head))
    layers = [(Part(heads, SnapKV(budget, min(obs_window, budget - 1), kernel)),) for _ in range(config.n_layer)]
    allocator = functools.partial(adakv_keep, budget=budget, safeguard=safeguard)
    return HeadwisePolicy(HeadPlan(tuple(layers), config.n_kv_head, allocator), f"adakv({budget})")
