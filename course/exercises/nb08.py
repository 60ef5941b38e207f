"""Notebook 08 (quantize, evict, or both): checkers, each against the course's quantized store (``course.quantize``)."""

from __future__ import annotations

import torch
from torch import Tensor

from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close, generator, tiny_model
from course.exercises.hints import hint
from course.policies import make_policy
from course.quantize import KIVI, RoundingFunction, dequantize, fake_quantize, quantize

_QUANTIZE = (KIVI.round_groups, KIVI.settle, fake_quantize, quantize, dequantize)


# ----------------------------------------------------------------------------- 1. one group, b bits
def _round_with_course(x: Tensor, bits: int, dim: int) -> Tensor:
    """AUTOFILL's rounding: the course's ``fake_quantize`` (asymmetric min-max, one scale per slice along dim)."""
    return fake_quantize(x, bits, dim)


def _first_wrong(fn, x: Tensor, cases: tuple, want) -> tuple[Tensor, tuple] | None:
    """The first case (the arguments after ``x``) in which ``fn(x, *case)`` differs from ``want(x, *case)``: its
    result as a tensor and the case; None when every case is right. A result of another shape is refused here."""
    for case in cases:
        got = fn(x.clone(), *case)
        if close(got, want(x, *case), 1e-6):
            continue
        got = torch.as_tensor(got)
        if got.shape != x.shape:
            raise Wrong(f"return the rounded numbers in the input's shape {list(x.shape)}, got {list(got.shape)}")
        return got, case
    return None


@exercise("08.round_trip", "Exercise 1 (b bits, asymmetric, one scale per group)", fallback=_round_with_course,
          shortcuts=_QUANTIZE)
def _check_round_trip(fn) -> None:
    x = torch.randn(3, 16, 8, generator=generator(8), dtype=torch.float64) * 3 + 1
    miss = _first_wrong(fn, x, ((2, 1), (4, -1), (8, 1)), fake_quantize)
    if miss is None:
        return
    got, (bits, dim) = miss
    levels = 2**bits - 1
    low = x.amin(dim, keepdim=True)
    span = x.amax(dim, keepdim=True) - low
    if close(got, _rounded(x, low, span / 2**bits, 2**bits), 1e-6):
        raise Wrong(f"b bits give 2^b codes, 0 .. 2^b - 1: the step is (max - min) / (2^b - 1) = span / {levels}")
    absmax = x.abs().amax(dim, keepdim=True)
    if close(got, _rounded(x, -absmax, 2 * absmax / levels, levels), 1e-6):
        raise Wrong("asymmetric quantization: the codes run from the slice's min to its max (zero point = min), "
                    "not symmetric around 0")
    if close(got, torch.floor((x - low) / (span / levels)) * (span / levels) + low, 1e-6):
        raise Wrong("round to the nearest code (torch.round), not down")
    if close(got, fake_quantize(x, bits, 0 if dim != 0 else 1), 1e-6):
        raise Wrong(f"one scale per slice along dim={dim}: min and max are taken along that dimension")
    raise Wrong(f"bits={bits}, dim={dim}: expected x' = round((x - min) / s) * s + min with s = (max - min) / "
                f"(2^b - 1), min and max along dim")


def _rounded(x: Tensor, low: Tensor, step: Tensor, top: int) -> Tensor:
    return ((x - low) / step).round().clamp(0, top) * step + low


# ----------------------------------------------------------------------------- 2. values per token
def _values_with_course(v: Tensor, bits: int, group: int) -> Tensor:
    """AUTOFILL's values: the course's KIVI rounding of values (per token, over groups of channels)."""
    return KIVI(bits=bits, group=group)._per_token(v)


@exercise("08.round_values", "Exercise 2 (values per token, over groups of channels)", fallback=_values_with_course,
          shortcuts=_QUANTIZE)
def _check_round_values(fn) -> None:
    v = torch.randn(2, 3, 5, 16, generator=generator(9), dtype=torch.float64) * 2
    v[..., 3] += 20  # one large channel: a slip that groups across tokens or channels shows
    miss = _first_wrong(fn, v, ((2, 4), (4, 8), (8, 16)), _values_with_course)
    if miss is None:
        return
    got, (bits, group) = miss
    if close(got, fake_quantize(v, bits, dim=-1), 1e-6):
        raise Wrong(f"one scale per group of {group} channels, not per whole token: reshape the last dimension "
                    f"into [d // group, group]")
    if close(got, fake_quantize(v, bits, dim=2), 1e-6):
        raise Wrong("values are rounded per token (scales along the channels), not per channel over the tokens")
    raise Wrong(f"bits={bits}, group={group}: expected each token's channels in groups of {group}, each group "
                f"rounded with its own min and max")


# ----------------------------------------------------------------------------- build: KIVI in the real cache
def _settle_with_course(keys: Tensor, values: Tensor, positions: Tensor, done: int, next_position: int, bits: int,
                        group: int, residual: int) -> tuple[Tensor, Tensor, int]:
    """AUTOFILL's build: the course's KIVI rounding (``KIVI.round_groups``)."""
    settled = KIVI(bits=bits, group=group, residual=residual).round_groups(keys, values, positions, done, next_position)
    return keys, values, settled


SETTINGS = (  # (policy, budget, KIVI settings) the build runs under
    ("full", None, dict(bits=2, group=4, residual=6)),
    ("window", 24, dict(bits=4, group=4, residual=3, exact_sinks=2)),
    ("h2o", 20, dict(bits=2, group=8, residual=0)),
    ("full", None, dict(bits=8, group=2, residual=5, exact_sinks=3)),
)


def _run(fn_or_kivi, model, ids: Tensor, name: str, budget: int | None, settings: dict):
    """The cache after decoding ``ids`` [B, T] token by token with a store made of ``fn_or_kivi`` (a rounding function
    or a KIVI), and the logits of every step [B, T, vocab]."""
    store = fn_or_kivi if isinstance(fn_or_kivi, KIVI) else RoundingFunction(fn=fn_or_kivi, **settings)
    cache = model.new_cache(ids.shape[0], make_policy(name, budget, quantizer=store))
    with torch.inference_mode():
        logits = torch.cat([model(ids[:, t : t + 1], cache=cache).logits for t in range(ids.shape[1])], 1)
    return cache, logits


def _same(a, b) -> bool:
    (ca, la), (cb, lb) = a, b
    return close(la, lb, 1e-9) and all(
        close(x, y, 1e-9) for l1, l2 in zip(ca.layers, cb.layers) for x, y in zip(l1.live(), l2.live()))


@exercise("08.kivi_settle", "Build exercise (KIVI's rounding inside the real cache)", points=6, kind="build",
          fallback=_settle_with_course, shortcuts=_QUANTIZE)
def _check_kivi_settle(fn) -> None:
    model = tiny_model("llama", seed=8)
    ids = torch.randint(0, 53, (2, 40), generator=generator(8))
    for name, budget, settings in SETTINGS:
        try:
            got = _run(fn, model, ids, name, budget, settings)
        except ValueError as e:
            if "the rounding function must return" in str(e):
                raise Wrong(hint(2, str(e))) from None
            raise
        if _same(got, _run(KIVI(**settings), model, ids, name, budget, settings)):
            continue
        raise Wrong(_diagnose(got, model, ids, name, budget, settings))


def _diagnose(got, model, ids: Tensor, name: str, budget: int | None, settings: dict) -> str:
    """The mistake behind a wrong store: the course's KIVI run with one setting changed that gives the same cache."""
    where = f"{name} cache, {settings}"
    r = settings["residual"]
    variants = [
        (dict(settings, keys="token"), 1, "keys are rounded per channel: one min and max per channel over the group's "
                                          "tokens (dim 2 of [B, H_kv, S, d]), not per token"),
        (dict(settings, residual=r + 1), 1, "a group leaves the residual when done + group <= next_position - "
                                            "residual: you waited one token too long"),
        (dict(settings, residual=max(r - 1, 0)), 1, "a group leaves the residual when done + group <= next_position - "
                                                    "residual: you rounded it one token too early"),
        (dict(settings, residual=0), 1, "the newest `residual` tokens stay in full precision: only groups older than "
                                        "them are rounded"),
    ]
    for changed, number, text in variants:
        if changed != settings and _same(got, _run(KIVI(**changed), model, ids, name, budget, settings)):
            return hint(number, f"{where}: {text}")
    cache = got[0]
    last = ids.shape[1] - 1
    untouched = _run(KIVI(**dict(settings, residual=last + 1)), model, ids, name, budget, settings)
    if _same(got, untouched):
        return hint(1, f"{where}: nothing was rounded: quantize every key group that left the residual and return "
                       "where the next group starts")
    layer = cache.layers[0]
    if not torch.isfinite(layer.keys[:, :, : layer.length]).all():
        return hint(3, f"{where}: your keys hold inf or nan: take min and max over the group's slots only (mask the "
                       "others with +inf / -inf, then keep the old numbers outside the group with torch.where)")
    return hint(1, f"{where}: your cache differs from the course's KIVI store (keys per channel over each group of "
                   "tokens, values per token over groups of channels, asymmetric min-max, returned as (keys, values, "
                   "done))")
