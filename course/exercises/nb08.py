"""Notebook 08 (quantize, evict, or both): checkers, each against the course's quantized store (``course.quantize``).

What the text leaves open is accepted: the dtype of the intermediates (the inputs' own, float32 or wider: the checks
feed float64 and compare to ``TOL`` for the round trips, ``CACHE_TOL`` for the cache), how a number exactly half-way
between two codes rounds, copies or in-place changes of the (copied) inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close, generator, tiny_model
from course.exercises.hints import hint
from course.policies import make_policy
from course.quantize import KIVI, RoundingFunction, dequantize, fake_quantize, quantize

_QUANTIZE = (KIVI.round_groups, KIVI.settle, fake_quantize, quantize, dequantize)
TOL = 1e-6  # the round trips' tolerance (absolute, and relative to the number): float32 intermediates stay inside it
HALF = 1e-3  # a number this near (in codes) a half-way point between two codes may come back one code off


# ----------------------------------------------------------------------------- 1. one group, b bits
def _round_with_course(x: Tensor, bits: int, dim: int) -> Tensor:
    """AUTOFILL's rounding: the course's ``fake_quantize`` (asymmetric min-max, one scale per slice along dim)."""
    return fake_quantize(x, bits, dim)


def same_rounding(got, x: Tensor, bits: int, dim: int, want: Tensor, tol: float = TOL) -> bool:
    """Whether ``got`` is ``want``, x's round trip along ``dim`` (same shape, every number within ``tol``), where a
    number of x at a half-way point between two codes (or within float32's error of one) may also come back one
    step off: the text fixes neither how halves round nor the dtype of the intermediates."""
    try:
        got = torch.as_tensor(got).double()
    except (TypeError, RuntimeError, ValueError):
        return False
    if got.shape != x.shape or not bool(torch.isfinite(got).all()):
        return False
    xd, want = x.double(), want.double()
    low = xd.amin(dim, keepdim=True)
    span = xd.amax(dim, keepdim=True) - low
    step = torch.where(span > 0, span / (2**bits - 1), torch.ones_like(span))
    code = (xd - low) / step
    near_half = (code - code.floor() - 0.5).abs() < HALF
    diff, room = (got - want).abs(), tol * (1 + want.abs())
    return bool(((diff <= room) | (near_half & ((diff - step).abs() <= room))).all())


def first_mismatch(got, want: Tensor, x: Tensor) -> str:
    """Where ``got`` and ``want`` differ most: the index, x's number there, the expected and the received number."""
    got, want = torch.as_tensor(got).double(), want.double()
    diff = (got - want).abs().nan_to_num(float("inf"))
    index = tuple(int(i) for i in torch.unravel_index(diff.flatten().argmax(), want.shape))
    return (f"at index {list(index)} (x = {float(x.double()[index]):.4f}) expected {float(want[index]):.4f}, "
            f"got {float(got[index]):.4f}")


def _first_wrong(fn, x: Tensor, cases: tuple, want, slices) -> tuple[Tensor, tuple] | None:
    """The first case (the arguments after ``x``) in which ``fn(x, *case)`` differs from ``want(x, *case)``: its
    result as a tensor and the case; None when every case is right. A result of another shape is refused here.
    ``slices(t, case) -> (t viewed so that the round trip's slices lie along a dim, that dim)``."""
    for case in cases:
        got = fn(x.clone(), *case)
        expected = want(x, *case)
        try:
            shaped = torch.as_tensor(got)
        except (TypeError, RuntimeError, ValueError):
            raise Wrong(f"return the rounded numbers as a tensor of the input's shape {list(x.shape)}, got "
                        f"{type(got).__name__}") from None
        if shaped.shape != x.shape:
            raise Wrong(f"return the rounded numbers in the input's shape {list(x.shape)}, got {list(shaped.shape)}")
        (xs, dim), (gs, _), (ws, _) = slices(x, case), slices(shaped, case), slices(expected, case)
        if not same_rounding(gs, xs, case[0], dim, ws):
            return shaped, case
    return None


@exercise("08.round_trip", "Exercise 1 (b bits, asymmetric, one scale per group)", fallback=_round_with_course,
          shortcuts=_QUANTIZE)
def _check_round_trip(fn) -> None:
    x = torch.randn(3, 16, 8, generator=generator(8), dtype=torch.float64) * 3 + 1
    along = lambda t, case: (t, case[1])  # noqa: E731
    miss = _first_wrong(fn, x, ((2, 1), (4, -1), (8, 1)), fake_quantize, along)
    if miss is None:
        flat = x.clone()
        flat[1, :, 2] = 0.75  # one slice along dim 1 whose numbers are all equal: it must come back exactly
        got = fn(flat.clone(), 2, 1)
        if not same_rounding(got, flat, 2, 1, fake_quantize(flat, 2, 1)):
            raise Wrong(f"bits=2, dim=1, input {list(flat.shape)} whose slice x[1, :, 2] is all 0.75: a slice whose "
                        "numbers are all equal comes back exactly (use s = 1 there, not 0 / 0); "
                        + first_mismatch(got, fake_quantize(flat, 2, 1), flat))
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
    raise Wrong(f"bits={bits}, dim={dim}, x of shape {list(x.shape)} (float64): expected x' = round((x - min) / s) * s "
                f"+ min with s = (max - min) / (2^b - 1), min and max along dim; "
                + first_mismatch(got, fake_quantize(x, bits, dim), x))


def _rounded(x: Tensor, low: Tensor, step: Tensor, top: int) -> Tensor:
    return ((x - low) / step).round().clamp(0, top) * step + low


# ----------------------------------------------------------------------------- 2. values per token
def _values_with_course(v: Tensor, bits: int, group: int) -> Tensor:
    """AUTOFILL's values: the course's KIVI rounding of values (per token, over groups of channels)."""
    return KIVI(bits=bits, group=group)._per_token(v)


def _channel_groups(t: Tensor, case: tuple) -> tuple[Tensor, int]:
    """[B, H, T, d] as [B, H, T, d // group, group]: the slices of the values' round trip lie along the last dim."""
    group = case[1]
    return t.reshape(*t.shape[:-1], t.shape[-1] // group, group), -1


@exercise("08.round_values", "Exercise 2 (values per token, over groups of channels)", fallback=_values_with_course,
          shortcuts=_QUANTIZE)
def _check_round_values(fn) -> None:
    v = torch.randn(2, 3, 5, 16, generator=generator(9), dtype=torch.float64) * 2
    v[..., 3] += 20  # one large channel: a slip that groups across tokens or channels shows
    miss = _first_wrong(fn, v, ((2, 4), (4, 8), (8, 16)), _values_with_course, _channel_groups)
    if miss is None:
        return
    got, (bits, group) = miss
    if close(got, fake_quantize(v, bits, dim=-1), 1e-6):
        raise Wrong(f"one scale per group of {group} channels, not per whole token: reshape the last dimension "
                    f"into [d // group, group]")
    if close(got, fake_quantize(v, bits, dim=2), 1e-6):
        raise Wrong("values are rounded per token (scales along the channels), not per channel over the tokens")
    raise Wrong(f"bits={bits}, group={group}, v of shape {list(v.shape)} (float64, channel 3 large): expected each "
                f"token's channels in groups of {group}, each group rounded with its own min and max; "
                + first_mismatch(got, _values_with_course(v, bits, group), v))


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


CACHE_TOL = 1e-5  # the cache's tolerance: a store rounding in float32 (the check's model is float64) stays inside it


class _KIVIInFloat32(KIVI):
    """The course's KIVI with its rounding computed in float32 whatever the cache's dtype: the reference for a store
    whose intermediates are float32 (a number at a code's edge may round the other way there, and the change then
    runs through the model)."""

    def round_groups(self, keys: Tensor, values: Tensor, positions: Tensor, done: int, next_position: int) -> int:
        k, v = keys.float(), values.float()
        settled = super().round_groups(k, v, positions, done, next_position)
        keys.copy_(k)
        values.copy_(v)
        return settled


def _run(fn_or_kivi, model, ids: Tensor, name: str, budget: int | None, settings: dict):
    """The cache after decoding ``ids`` [B, T] token by token with a store made of ``fn_or_kivi`` (a rounding function
    or a KIVI), and the logits of every step [B, T, vocab]."""
    store = fn_or_kivi if isinstance(fn_or_kivi, KIVI) else RoundingFunction(fn=fn_or_kivi, **settings)
    cache = model.new_cache(ids.shape[0], make_policy(name, budget, quantizer=store))
    with torch.inference_mode():
        logits = torch.cat([model(ids[:, t : t + 1], cache=cache).logits for t in range(ids.shape[1])], 1)
    return cache, logits


def _same(a, b, tol: float = CACHE_TOL) -> bool:
    (ca, la), (cb, lb) = a, b
    return close(la, lb, tol) and all(
        close(x, y, tol) for l1, l2 in zip(ca.layers, cb.layers) for x, y in zip(l1.live(), l2.live()))


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
                raise Wrong(hint(2, f"{name} cache, {settings}: {e}")) from None
            raise
        want = _run(KIVI(**settings), model, ids, name, budget, settings)
        if _same(got, want) or _same(got, _run(_KIVIInFloat32(**settings), model, ids, name, budget, settings)):
            continue
        raise Wrong(_diagnose(got, want, model, ids, name, budget, settings))


def _first_difference(got, want) -> str:
    """The first layer and slot where two runs' caches differ (or their logits): what was expected and received."""
    (cg, lg), (cw, lw) = got, want
    for i, (lay_g, lay_w) in enumerate(zip(cg.layers, cw.layers)):
        (kg, vg, pg), (kw, vw, pw) = lay_g.live()[:3], lay_w.live()[:3]
        if not torch.equal(pg, pw):
            return f"layer {i}: the cache holds positions {pg[0, 0].tolist()}, the course's {pw[0, 0].tolist()}"
        for what, g, w in (("keys", kg, kw), ("values", vg, vw)):
            if close(g, w, CACHE_TOL):
                continue
            diff = (g.double() - w.double()).abs().nan_to_num(float("inf")).amax(-1)  # [B, H_kv, S]
            b, h, s = (int(j) for j in torch.unravel_index(diff.flatten().argmax(), diff.shape))
            return (f"layer {i}, the {what} of the token at position {int(pw[b, h, s])} (batch row {b}, KV head {h}): "
                    f"expected {[round(float(x), 4) for x in w[b, h, s, :3]]}..., got "
                    f"{[round(float(x), 4) for x in g[b, h, s, :3]]}... (largest difference {float(diff.max()):.3g})")
    return f"the logits differ (largest difference {float((lg - lw).abs().max()):.3g}) though the caches agree"


def _diagnose(got, want, model, ids: Tensor, name: str, budget: int | None, settings: dict) -> str:
    """The mistake behind a wrong store: the course's KIVI run with one setting changed that gives the same cache."""
    where = f"{name} cache, {settings}, {ids.shape[1]} tokens fed one at a time"
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
                   f"done)); first difference: {_first_difference(got, want)}")
