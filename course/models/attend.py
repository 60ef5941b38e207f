"""Scaled dot-product attention, written out once for both model families.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d) + mask) V          (Vaswani et al. 2017, eq. 1)

Two paths compute the same thing:

* ``explicit``: the equation above line by line; it can return the attention weights,
  which the analysis notebooks and the H2O/SnapKV policies read;
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``, a fused kernel that never
  materialises the weights (faster, less memory). It always computes the output (outside
  ``reference_mode``); weights a caller asks for are computed beside it, for the rows asked.

Grouped-query attention (GQA): there are H query heads but only H_kv key/value heads; query
head h uses KV head h // (H / H_kv). Neither path copies K/V to H heads.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["attend", "attention_weights", "reference_mode", "reference_active"]


_REFERENCE = False


def reference_active() -> bool:
    """Is ``reference_mode`` on?"""
    return _REFERENCE


@contextmanager
def reference_mode() -> Iterator[None]:
    """Inside ``with reference_mode():`` every attention takes the explicit path (the equation
    written out), never the fused kernel, and the caches made there keep Llama keys before rotation
    (``CausalLM.new_cache``): the documented reference that the fast paths must match."""
    global _REFERENCE
    previous, _REFERENCE = _REFERENCE, True
    try:
        yield
    finally:
        _REFERENCE = previous


def _split_groups(q: Tensor, kv_heads: int) -> Tensor:
    """[B, H, T, d] -> [B, H_kv, G, T, d] with G = H / H_kv query heads per KV head."""
    b, h, t, d = q.shape
    return q.reshape(b, kv_heads, h // kv_heads, t, d)


def attention_weights(
    q: Tensor, k: Tensor, mask: Tensor | None = None, scale: float | None = None, sink_logit: Tensor | None = None,
) -> Tensor:
    """softmax(Q K^T * scale + mask) for every query head: [B, H, T, S].

    q: [B, H, T, d]; k: [B, H_kv, S, d]; mask: bool [B, 1 or H_kv, T, S] (True = may attend).
    sink_logit: [H] optional learned logit of an empty "sink" slot that takes part in the
    softmax but has no value (the returned weights then sum to 1 - its share).
    """
    b, h, t, d = q.shape
    kv = k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = _split_groups(q, kv) @ k[:, :, None].transpose(-1, -2) * scale  # [B, H_kv, G, T, S]
    if mask is not None:
        scores = scores.masked_fill(~mask[:, :, None], -math.inf)
    scores = scores.reshape(b, h, t, -1)
    if sink_logit is None:
        return torch.softmax(scores, dim=-1)
    extra = sink_logit.to(scores.dtype).view(1, h, 1, 1).expand(b, h, t, 1)
    return torch.softmax(torch.cat([scores, extra], dim=-1), dim=-1)[..., :-1]


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    weight_rows: int = 0,
    explicit: bool = False,
    sink_logit: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Attention output [B, H, T, d_v] and, if ``weight_rows`` > 0, the weights of the last rows.

    q: [B, H, T, d]; k: [B, H_kv, S, d]; v: [B, H_kv, S, d_v]
    mask: bool [B, 1 or H_kv, T, S], True where a query may attend; or ``causal=True``
    (queries and keys aligned, T == S) for a plain causal prompt.
    weight_rows: how many of the last query rows' weights to return ([B, H, rows, S]).
    explicit: force the explicit path (the reference) even when no weights are needed.
    """
    b, h, t, _ = q.shape
    s = k.shape[2]
    if causal:
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)[None, None]
    if explicit or _REFERENCE:
        w = attention_weights(q, k, mask, scale, sink_logit)  # [B, H, T, S]
        out = (_split_groups(w.to(v.dtype), k.shape[1]) @ v[:, :, None]).reshape(b, h, t, -1)
        return out, (w[:, :, t - min(weight_rows, t) :] if weight_rows else None)
    # The output never depends on how many weight rows are asked for: the same forward gives the
    # same numbers whichever policies read its weights (course.kvcache.CacheGroup relies on it).
    out = _sdpa(q, k, v, mask, scale, sink_logit)
    if weight_rows == 0:
        return out, None
    rows = slice(t - min(weight_rows, t), t)
    w = attention_weights(q[:, :, rows], k, None if mask is None else mask[:, :, rows], scale, sink_logit)
    return out, w


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None, sink_logit: Tensor | None) -> Tensor:
    """The fused path. A sink logit becomes one extra key of zeros whose score is the logit."""
    b, h, t, _ = q.shape
    kv = k.shape[1]
    if mask is not None and mask.shape[1] > 1:
        mask = mask.repeat_interleave(h // kv, dim=1)  # per KV head -> per query head
    if mask is not None:  # an additive mask keeps grouped-query attention on the fused CPU kernel
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, -math.inf)
    if sink_logit is not None:
        s = k.shape[2]
        k = torch.cat([k, k.new_zeros(b, kv, 1, k.shape[-1])], dim=2)
        v = torch.cat([v, v.new_zeros(b, kv, 1, v.shape[-1])], dim=2)
        real = mask.expand(b, h, t, s) if mask is not None else q.new_zeros(b, h, t, s)
        mask = torch.cat([real, sink_logit.to(q.dtype).view(1, h, 1, 1).expand(b, h, t, 1)], dim=-1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=kv != h)
