"""KIVI's store (Liu et al. 2024, arXiv 2402.02750): keys per channel, values per token, a full-precision residual.

* **Keys per channel.** A few key channels carry outliers for every token, so one scale per *channel*, over a group
  of G consecutive tokens, fits each channel's range (KIVI §3.2). The store rounds keys as the cache holds them: in a
  cache of keys before rotation (the course's readable path) that is before the rotary embedding, where the outlier
  channels stay put (KVQuant, Hooper et al. 2024, arXiv 2401.18079, §3.1); in a cache of rotated keys
  (``new_cache(rotated=True)``, transformers' ``PolicyCache``) as they arrive, rotated, as KIVI's own code does.
  ``course.storage.kivi_post_rope`` rounds them rotated in either cache.
* **Values per token.** One scale per *token*, over a group of G channels.
* **A full-precision residual.** The most recent ``residual`` tokens (and the tokens of a key group not yet full)
  stay in full precision; a key group is quantized once all of its G tokens are older than that.

Simulated storage: the cache keeps ``x'`` (the dequantized numbers, exactly what unpacking the codes gives) in its
own tensors; ``KIVI.nbytes`` counts what a packed store holds: b-bit codes, a 16-bit scale and zero point per group,
and the full-precision tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from course.storage.base import Storage, register_storage
from course.storage.rounding import fake_quantize, wide

if TYPE_CHECKING:  # pragma: no cover
    from course.slots import LayerCache

__all__ = ["KIVI", "RoundingFunction", "GROUP_STAT", "BITS"]

GROUP_STAT = "kivi_group"  # per-slot stat: 0 full precision, g + 1 for a key in quantized group g
BITS = (2, 4, 8)


def _check(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


@register_storage
@dataclass(frozen=True)
class KIVI(Storage):
    """KIVI-style storage: keys per channel over groups of ``group`` tokens, values per token over groups of
    ``group`` channels, ``bits`` per number, the last ``residual`` tokens and the first ``exact_sinks`` tokens in
    full precision. ``scale_bytes``: bytes of one scale or zero point (16-bit, as KIVI stores them).
    ``keys="token"`` groups the keys per token like the values: the layout KIVI shows fails at 2 bits (its §3.1),
    and the one transformers' ``QuantizedCache`` uses (quanto, axis 0: groups of channels within a token)."""

    bits: int = 4
    group: int = 32
    residual: int = 32
    exact_sinks: int = 0
    scale_bytes: int = 2
    keys: Literal["channel", "token"] = "channel"

    name = "kivi"
    rounds = True
    slot_stat = GROUP_STAT

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {self.bits!r}")
        if self.keys not in ("channel", "token"):
            raise ValueError(f"keys must be 'channel' (KIVI) or 'token' (grouped like the values), got {self.keys!r}")
        _check("group", self.group, 1)
        _check("residual", self.residual, 0)
        _check("exact_sinks", self.exact_sinks, 0)
        _check("scale_bytes", self.scale_bytes, 1)

    @property
    def label(self) -> str:
        sinks = f", {self.exact_sinks} exact" if self.exact_sinks else ""
        return f"{self.bits}-bit{sinks}"

    def check_head_dim(self, head_dim: int) -> None:
        """Values are grouped along the head dimension: the group must divide it."""
        if head_dim % self.group:
            raise ValueError(f"group must divide the head dimension {head_dim} (values are quantized per token in "
                             f"groups of channels), got group={self.group}")

    # ----------------------------------------------------------------------------- the cache's calls
    def chunk_starts(self, n_tokens: int) -> list[int]:
        """Where a chunk of a stream must start for the exact evaluator: at every position residual + k G (k >= 1),
        below ``n_tokens``. Between two of them no key group leaves the residual, so every query of a chunk sees the
        keys quantized exactly as when it was decoded alone."""
        first = self.residual + self.group
        return list(range(first, n_tokens, self.group))

    def check_chunk(self, first: int, tokens: int) -> None:
        """Refuse a stream chunk at positions first .. first + tokens - 1 that a key group leaves the residual
        within (its later queries would see that group quantized, the earlier ones not)."""
        inside = [s for s in self.chunk_starts(first + tokens) if first < s]
        if inside:
            raise ValueError(f"a stream chunk of the quantized store may not cross position {inside[0]}, where a key "
                             f"group leaves the residual: cut chunks at KIVI.chunk_starts (got positions {first}.."
                             f"{first + tokens - 1})")

    @torch.no_grad()
    def settle(self, keys: Tensor, values: Tensor, positions: Tensor, group_id: Tensor, done: int,
               next_position: int, *, rotated: bool = False) -> int:
        """Quantize, in place, every key group whose tokens are all older than the residual window of a token at
        ``next_position``; ``done``: where the first group not yet quantized starts (a position). keys, values
        [B, H_kv, S, d], positions [B, H_kv, S] and ``group_id`` (the per-slot ``GROUP_STAT``, [B, H_kv, S]) are
        views of one layer's storage (the cache passes its whole batch, or one row at a time where the rows
        are at different positions of their streams). Returns the new ``done``. Keys are rounded as given, rotated
        or not (``rotated``).

        Group g holds the tokens at positions g*G .. (g+1)*G - 1; the tokens of a group that eviction already
        dropped are simply absent, each (batch row, KV head) quantizing the ones it still holds. Keys: min and max per
        channel over the group's tokens; values: per token, over groups of channels. The first ``exact_sinks`` tokens
        take part in their group's scales and are then put back as they were (stored in full precision)."""
        sinks = positions < self.exact_sinks if self.exact_sinks > done else None  # a group to round may hold sinks
        if sinks is not None:
            exact_keys, exact_values = keys[sinks], values[sinks]  # copies: [sinks held, d]
        settled = self.round_groups(keys, values, positions, done, next_position)
        if sinks is not None and settled > done:
            keys[sinks], values[sinks] = exact_keys, exact_values
        for start in range(done, settled, self.group):  # which slots are quantized, in which key group (for nbytes)
            member = (positions >= max(start, self.exact_sinks)) & (positions < start + self.group)
            group_id.copy_(torch.where(member, float(start // self.group + 1), group_id))
        return settled

    def round_groups(self, keys: Tensor, values: Tensor, positions: Tensor, done: int, next_position: int) -> int:
        """The rounding itself, in place on one layer's slots (keys, values [B, H_kv, S, d], positions [B, H_kv, S]):
        every key group from ``done`` on whose tokens are all older than the residual of a token at
        ``next_position``. Returns where the next group starts."""
        while done + self.group <= next_position - self.residual:
            self._quantize_group(keys, values, positions, done)
            done += self.group
        return done

    def _quantize_group(self, keys: Tensor, values: Tensor, positions: Tensor, start: int) -> None:
        member = (positions >= start) & (positions < start + self.group)  # [B, H_kv, S]
        if not bool(member.any()):
            return
        inside = member[..., None]
        k_q = self._per_channel(keys, inside) if self.keys == "channel" else self._per_token(keys)
        keys.copy_(torch.where(inside, k_q, keys))
        values.copy_(torch.where(inside, self._per_token(values), values))

    def _per_channel(self, x: Tensor, inside: Tensor) -> Tensor:
        """x [B, H_kv, S, d] rounded with one scale per channel over the slots ``inside`` ([B, H_kv, S, 1])."""
        k = x.to(wide(x.dtype))
        low = k.masked_fill(~inside, torch.inf).amin(dim=2, keepdim=True)  # [B, H_kv, 1, d]
        high = k.masked_fill(~inside, -torch.inf).amax(dim=2, keepdim=True)
        span = (high - low).nan_to_num(0.0)
        scale = torch.where(span > 0, span / (2**self.bits - 1), torch.ones_like(span))
        return (((k - low) / scale).round().clamp(0, 2**self.bits - 1) * scale + low).to(x.dtype)

    def _per_token(self, x: Tensor) -> Tensor:
        """x [B, H_kv, S, d] rounded with one scale per token over each group of ``group`` channels."""
        b, h, s, d = x.shape
        return fake_quantize(x.reshape(b, h, s, d // self.group, self.group), self.bits, dim=-1).reshape(b, h, s, d)

    # ----------------------------------------------------------------------------- what the store holds
    def nbytes(self, layer: LayerCache, dtype_bytes: int) -> int:
        """Bytes of one layer's keys and values as a packed store holds them: for each quantized slot its codes
        (2 d numbers at ``bits``) and its values' scales and zero points (d / G groups); for each quantized key group
        still holding a token in a (batch row, KV head), d scales and d zero points (``keys="token"``: each
        quantized key its own d / G scales and zero points, as its value); every other slot in full
        precision (2 d numbers at ``dtype_bytes``)."""
        b, h, s, d = layer.live()[0].shape
        group_id = layer.stat(self.slot_stat)  # [B, H_kv, S]
        quantized = int((group_id > 0).sum())
        full = b * h * s - quantized
        code_bits = quantized * 2 * d * self.bits
        value_scales = quantized * (d // self.group) * 2 * self.scale_bytes
        if self.keys == "token":
            return full * 2 * d * dtype_bytes + (code_bits + 7) // 8 + 2 * value_scales
        ordered = group_id.sort(dim=-1).values  # distinct group ids per (batch row, KV head): count the changes
        key_groups = int((ordered[..., :1] > 0).sum() + ((ordered[..., 1:] != ordered[..., :-1])
                                                        & (ordered[..., 1:] > 0)).sum())
        key_scales = key_groups * d * 2 * self.scale_bytes
        return full * 2 * d * dtype_bytes + (code_bits + 7) // 8 + value_scales + key_scales

    def max_bytes(self, slots: int, n_layers: int, batch: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
        """The most bytes ``nbytes`` can count for a cache holding at most ``slots`` slots per (layer, batch row, KV
        head): at most exact_sinks + residual + group of them in full precision (the sinks, the residual window and a
        key group not yet full, the new token included), every other one quantized and, at worst, the only token left
        of its key group (eviction can leave one), paying for that group's key scales alone."""
        full = min(slots, self.exact_sinks + self.residual + self.group)
        quantized = slots - full
        scales = (head_dim // self.group) * 2 * self.scale_bytes  # a value's (or a per-token key's) scales and zeros
        key_scales = scales if self.keys == "token" else head_dim * 2 * self.scale_bytes
        per_head = (full * 2 * head_dim * dtype_bytes + (quantized * 2 * head_dim * self.bits + 7) // 8
                    + quantized * (scales + key_scales))
        return n_layers * batch * kv_heads * per_head

    def bytes_per_token(self, n_layers: int, kv_heads: int, head_dim: int) -> float:
        """Bytes one quantized token costs in a cache of these shapes, its share of the key groups' scales
        included (the long-run cost per token, the residual aside): 2 L H_kv (d b / 8 + 2 s d / G) either way (a
        per-channel key group's d scales are shared by G tokens, a token's d / G key groups are its own)."""
        per_head = 2 * head_dim * self.bits / 8 + 4 * self.scale_bytes * head_dim / self.group
        return n_layers * kv_heads * per_head


@dataclass(frozen=True)
class RoundingFunction(KIVI):
    """KIVI's store with its rounding done by a function (notebook 08's build):
    ``fn(keys, values, positions, done, next_position, bits, group, residual) -> (keys, values, done)`` returns one
    layer's keys and values [B, H_kv, S, d] with the key groups that left the residual rounded, and where the next
    group starts (``KIVI.round_groups``' work, given back rather than written in place, so that it can come from
    another process: the grader's). The store writes them into the cache."""

    fn: Callable[..., tuple] | None = None

    def round_groups(self, keys: Tensor, values: Tensor, positions: Tensor, done: int, next_position: int) -> int:
        out = self.fn(keys.clone(), values.clone(), positions.clone(), done, next_position, self.bits, self.group,
                      self.residual)
        if not (isinstance(out, tuple) and len(out) == 3):
            raise ValueError(f"the rounding function must return (keys, values, done), got {type(out).__name__}")
        new_keys, new_values, settled = out
        if isinstance(settled, bool) or not isinstance(settled, int) or not done <= settled <= max(done, next_position):
            raise ValueError(f"the rounding function must return where the next key group starts, an integer from "
                             f"done={done} to at most next_position={next_position}; got {settled!r}")
        for name, new, old in (("keys", new_keys, keys), ("values", new_values, values)):
            if tuple(getattr(new, "shape", ())) != tuple(old.shape):
                raise ValueError(f"the rounding function must return {name} of the shape it was given, "
                                 f"{list(old.shape)}; got {list(getattr(new, 'shape', []))}")
        keys.copy_(new_keys)
        values.copy_(new_values)
        return settled


