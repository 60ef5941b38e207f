"""The rounding the quantized stores are made of: asymmetric min-max quantization of a slice of numbers.

With m = min, M = max over a group (KIVI eq. 2):

    scale = (M - m) / (2^b - 1),   code = round((x - m) / scale) in 0 .. 2^b - 1,   x' = code * scale + m.

Notebook 08 teaches these functions (``course.quantize`` re-exports them); the stores in ``course.storage`` use them.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["quantize", "dequantize", "fake_quantize", "wide", "round_by_groups", "error_by_token"]


def quantize(x: Tensor, bits: int, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric min-max quantization of ``x`` with one scale and zero point per slice along ``dim``.

    Returns codes (uint8, x's shape, values 0 .. 2^bits - 1), scale and zero (float32, x's shape with ``dim`` of
    size 1), computed in float32 or wider. A group whose numbers are all equal gets scale 1 (its codes are 0 and it
    comes back exactly)."""
    x = x.to(wide(x.dtype))
    zero = x.amin(dim=dim, keepdim=True)
    span = x.amax(dim=dim, keepdim=True) - zero
    scale = torch.where(span > 0, span / (2**bits - 1), torch.ones_like(span))
    codes = ((x - zero) / scale).round().clamp(0, 2**bits - 1).to(torch.uint8)
    return codes, scale, zero


def dequantize(codes: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
    """x' = code * scale + zero (in the scale's dtype)."""
    return codes.to(scale.dtype) * scale + zero


def wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype rounding is computed in: float32, or the input's own if wider (float64)."""
    return torch.promote_types(dtype, torch.float32)


def fake_quantize(x: Tensor, bits: int, dim: int) -> Tensor:
    """``dequantize(quantize(x))`` in x's dtype: the numbers a b-bit store gives back."""
    return dequantize(*quantize(x, bits, dim)).to(x.dtype)


def round_by_groups(keys: Tensor, bits: int, group: int) -> Tensor:
    """KIVI's per-channel rounding of keys [H, T, d] over consecutive groups of ``group`` tokens (a last partial
    group too): the rounded keys [H, T, d] in float32."""
    k = keys.float()
    return torch.cat([fake_quantize(k[:, s : s + group], bits, dim=1) for s in range(0, k.shape[1], group)], dim=1)


def error_by_token(keys: Tensor, bits: int, group: int) -> Tensor:
    """How much KIVI's per-channel rounding changes each key: ||k' - k|| / ||k|| per token, for keys [H, T, d]
    quantized per channel over consecutive groups of ``group`` tokens (``round_by_groups``): [H, T]."""
    k = keys.float()
    return (round_by_groups(k, bits, group) - k).norm(dim=-1) / k.norm(dim=-1)
