"""Where does attention go? Sink mass per layer and head, and the heads that are sinks.

All functions take the per-layer attention weights a model returns with
``output_attentions=True``: a list (one per layer) of [B, H, T, S] tensors, rows = queries.
"""

from __future__ import annotations

import torch
from torch import Tensor

from course.models.base import CausalLM

__all__ = ["attention_maps", "sink_mass", "sink_heads_share", "top_k_mass", "uniform_mass", "sink_kept"]


@torch.inference_mode()
def attention_maps(model: CausalLM, ids: Tensor) -> list[Tensor]:
    """Attention weights of every layer for a plain forward: list of [B, H, T, T] (CPU, float32)."""
    if ids.dim() == 1:
        ids = ids[None]
    model.config.check_tokens(ids.shape[1], "attention_maps")
    out = model(ids.to(model.device), output_attentions=True)
    return [w.float().cpu() for w in out.attentions]


def sink_mass(maps: list[Tensor], k: int = 1, skip: int | None = None) -> Tensor:
    """Mean attention mass on the first ``k`` keys: [layers, heads].

    Queries before position ``skip`` (default: 4 * k) are left out: a query at position < k can
    only attend to the first tokens, which would inflate the mass for a trivial reason.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    skip = 4 * k if skip is None else skip
    t = maps[0].shape[-2]
    if skip >= t:
        raise ValueError(f"skip={skip} leaves no query in a sequence of {t} tokens")
    return torch.stack([w[:, :, skip:, :k].sum(-1).mean(dim=(0, 2)) for w in maps])


def uniform_mass(t: int, k: int = 1, skip: int | None = None) -> float:
    """The mass the first k keys would get if every query spread attention evenly (causal)."""
    skip = 4 * k if skip is None else skip
    return float(sum(k / (q + 1) for q in range(skip, t)) / (t - skip))


def sink_heads_share(mass: Tensor, threshold: float = 0.5) -> float:
    """Share of (layer, head) pairs whose sink mass exceeds ``threshold``."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    return float((mass > threshold).float().mean())


def top_k_mass(maps: list[Tensor], fractions: list[float], skip: int = 16) -> Tensor:
    """Attention sparsity: mean mass held by the top fraction of keys, per layer: [layers, len(fractions)].

    For each query (from ``skip`` on), its visible keys are sorted by weight; the share of its
    attention held by the top ``f`` of them is averaged over queries and heads.
    """
    out = []
    for w in maps:
        w = w[:, :, skip:]
        t = w.shape[-2]
        sorted_w = w.sort(dim=-1, descending=True).values.cumsum(-1)  # [B, H, T, S]
        visible = torch.arange(skip, skip + t) + 1  # keys each query can see
        row = []
        for f in fractions:
            k = (visible.float() * f).ceil().long().clamp(min=1) - 1  # index of the last kept key
            row.append(sorted_w.gather(-1, k.view(1, 1, t, 1).expand(*w.shape[:3], 1)).mean())
        out.append(torch.stack(row))
    return torch.stack(out)


def sink_kept(cache, n_sink: int = 1) -> dict:
    """Which (layer, KV head) still cache the first ``n_sink`` tokens: share over batch rows, [layers, H_kv].

    Pass it as ``inspect=`` to ``course.streaming.decode_stream``."""
    kept = torch.stack([(layer.live()[2] < n_sink).sum(-1).float().div(n_sink).mean(0) for layer in cache.layers])
    return {"sink_kept": kept.cpu()}
