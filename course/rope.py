"""The rotary position embedding (RoPE; Su et al. 2021, arXiv 2104.09864): the one rotation of the course.

The Llama family rotates its queries and keys with it, and the cache rotates again the keys a policy moves
(``course.kvcache``); both import it from here, so that neither imports the other for it.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

__all__ = ["rotate_half", "rope", "rope_tables"]


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(x: Tensor, positions: Tensor, theta: float, tables: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Rotate x by its positions. x: [B, heads, N, d]; positions: [B, N] or [B, heads, N].

    Pair i of the d/2 pairs turns by angle  position * theta^(-2i/d):
        rope(x, p) = x * cos(p w) + rotate_half(x) * sin(p w)
    ``tables``: ``rope_tables(positions, ...)`` computed beforehand (the fast path: once per forward).
    """
    cos, sin = tables if tables is not None else rope_tables(positions, theta, x.shape[-1], x.dtype)
    return x * cos + rotate_half(x) * sin


def rope_tables(positions: Tensor, theta: float, d: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos(p w) and sin(p w) of ``rope``: [B, 1 or heads, N, d] each (each pair's two halves share an angle)."""
    wide = torch.promote_types(dtype, torch.float32)  # float32 angles (as transformers), float64 for tests
    if positions.dim() == 2:
        positions = positions[:, None, :]
    angles = positions[..., None].to(wide) * _inv_freq(theta, d, wide, positions.device)  # [B, 1 or heads, N, d/2]
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)


@functools.lru_cache(maxsize=16)
def _inv_freq(theta: float, d: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """w_i = theta^(-2i/d) for the d/2 pairs (the same few tensors, computed once)."""
    with torch.inference_mode(False), torch.no_grad():
        return 1.0 / (theta ** (torch.arange(0, d, 2, device=device, dtype=dtype) / d))
