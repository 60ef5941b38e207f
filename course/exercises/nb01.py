"""Notebook 01 (the KV cache): checkers, each against the course's own mechanisms."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close, drawn, tiny_model
from course.exercises.guards import GuardedModel
from course.exercises.hints import hint
from course.generate import sample_batch
from course.kvcache import cache_bytes_per_token
from course.memory import CONFIGS, cache_numbers_per_token, kv_bytes_per_token
from course.models.attend import attend


# ----------------------------------------------------------------------------- 1. one attention step
def _attention_step_with_attend(q: Tensor, k_new: Tensor, v_new: Tensor, K: Tensor, V: Tensor
                                ) -> tuple[Tensor, Tensor, Tensor]:
    """AUTOFILL's attention step: the grown cache and the course's ``attend`` over it."""
    K, V = torch.cat([K, k_new[None]]), torch.cat([V, v_new[None]])
    return attend(q[None, None, None], K[None, None], V[None, None])[0][0, 0, 0], K, V


@exercise("01.attention_step", "Exercise 1 (attention with a KV cache)", fallback=_attention_step_with_attend,
          shortcuts=(attend,))
def _check_attention_step(fn) -> None:
    torch.manual_seed(drawn(1))
    d, steps = 8, 6
    qs, ks, vs = torch.randn(steps, d) * 2, torch.randn(steps, d) * 2, torch.randn(steps, d)
    K, V = torch.zeros(0, d), torch.zeros(0, d)
    for t in range(steps):
        out = fn(qs[t], ks[t], vs[t], K, V)
        if not isinstance(out, tuple) or len(out) != 3:
            got = f"a tuple of {len(out)}" if isinstance(out, tuple) else type(out).__name__
            raise Wrong(f"return a tuple (output, K, V): the output and the grown cache (step {t}: got {got})")
        y, K_new, V_new = (torch.as_tensor(x) for x in out)
        if tuple(K_new.shape) != (t + 1, d) or tuple(V_new.shape) != (t + 1, d):
            raise Wrong(f"after step {t} the cache must hold {t + 1} rows of size {d} (one per token seen), "
                        f"got K {tuple(K_new.shape)} and V {tuple(V_new.shape)}: append exactly one row per step")
        if not close(K_new[-1], ks[t]) or not close(V_new[-1], vs[t]):
            raise Wrong(f"step {t}: the last row of the cache must be the new token's key and value (k_new, v_new), "
                        "appended after the rows of K and V")
        if tuple(y.shape) != (d,):
            raise Wrong(f"step {t}: the output must be one vector of size d, shape ({d},), got {tuple(y.shape)}")
        expected = F.scaled_dot_product_attention(qs[t][None, None], ks[: t + 1][None], vs[: t + 1][None])[0, 0]
        if not close(y, expected, 1e-5):
            itself = ("the new token must attend to itself too: append k_new, v_new to the cache *before* "
                      "computing the scores")
            if t == 0 and (close(y, torch.zeros(d)) or not bool(torch.isfinite(torch.as_tensor(y)).all())):
                raise Wrong(itself)  # an empty cache gave nothing to attend to
            unscaled = torch.softmax(ks[: t + 1] @ qs[t], 0) @ vs[: t + 1]
            if close(y, unscaled, 1e-5):
                raise Wrong("scale the scores by 1/sqrt(d) before the softmax")
            if t >= 2 and close(y, torch.softmax(ks[:t] @ qs[t] / math.sqrt(d), 0) @ vs[:t], 1e-5):
                raise Wrong(itself)
            if close(y, vs[: t + 1].mean(0), 1e-5) and t > 0:
                raise Wrong("your weights are uniform: is the softmax taken over the right axis (the keys)?")
            raise Wrong(f"at step {t} (d = {d}, {t + 1} cached rows) the output differs from softmax(K q / sqrt(d)) V: "
                        f"expected {_few(expected)}, got {_few(y)} (max difference "
                        f"{(y.double() - expected.double()).abs().max():.3g})")
        if y.dtype != qs.dtype or K_new.dtype != qs.dtype or V_new.dtype != qs.dtype:
            raise Wrong(f"step {t}: the values are right, but return the output and the cache in the inputs' dtype "
                        f"({qs.dtype}), got {y.dtype}, {K_new.dtype}, {V_new.dtype}: compute in any precision, cast "
                        "back (the cell below compares with torch.allclose, which refuses mixed dtypes)")
        K, V = K_new, V_new


def _few(x, n: int = 4) -> str:
    """The first ``n`` numbers of a tensor, for a message."""
    flat = torch.as_tensor(x).detach().double().flatten()
    more = ", ..." if flat.numel() > n else ""
    return "[" + ", ".join(f"{v:.4g}" for v in flat[:n].tolist()) + more + "]"


# ----------------------------------------------------------------------------- 2. bytes of a cache
def _cache_bytes(n_layers: int, kv_heads: int, head_dim: int, tokens: int, batch: int = 1, dtype_bytes: int = 2
                 ) -> int:
    """AUTOFILL's bytes of a cache, from the course's bytes per token."""
    return cache_bytes_per_token(n_layers, kv_heads, head_dim, dtype_bytes) * tokens * batch


@exercise("01.kv_cache_bytes", "Exercise 3 (bytes of a KV cache)", fallback=_cache_bytes,
          shortcuts=(cache_bytes_per_token, kv_bytes_per_token))
def _check_kv_cache_bytes(fn) -> None:
    cases = [(30, 3, 64, 1000, 3, 4), (32, 32, 128, 4096, 1, 2), (12, 12, 64, 1024, 8, 2), (40, 8, 128, 7, 3, 1)]
    for case in cases:
        got, want = fn(*case), _cache_bytes(*case)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise Wrong(f"return the number of bytes as an int, got {got!r}")
        if got == want:
            continue
        layers, heads, d, t, b, nb = case
        call = (f"kv_cache_bytes(n_layers={layers}, kv_heads={heads}, head_dim={d}, tokens={t}, batch={b}, "
                f"dtype_bytes={nb})")
        if got == want // nb:
            raise Wrong(f"{call}: {got:,} is a count of numbers, not bytes: multiply by dtype_bytes")
        if got * 2 == want:
            raise Wrong(f"{call}: got {got:,}, half of {want:,}: the cache holds keys AND values: multiply by 2")
        if got == want // b:
            raise Wrong(f"{call}: got {got:,}: every sequence in the batch has its own cache: multiply by batch")
        if got == want // layers:
            raise Wrong(f"{call}: got {got:,}: every layer has its own cache: multiply by n_layers")
        raise Wrong(f"{call} should be 2 x L x H_kv x d x T x B x dtype_bytes = {want:,} bytes, got {got!r}")


# ----------------------------------------------------------------------------- 3. greedy decoding
@torch.inference_mode()
def _greedy_with_course(model, prompt: Tensor, n_new: int) -> Tensor:
    """AUTOFILL's greedy decoding: the course's batch generation (greedy), prompt included."""
    return torch.cat([prompt, sample_batch(model, prompt, max_new_tokens=n_new)[0].to(prompt.device)], dim=1)


def _greedy_by_recomputation(model, prompt: Tensor, n_new: int) -> Tensor:
    ids = prompt
    with torch.inference_mode():
        for _ in range(n_new):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def _keys_per_token(guarded: GuardedModel, batch: int, fed: int, slack: int = 0) -> str | None:
    """Why the keys projected are not one per token fed (+ ``slack`` wasted ones) and layer, or None."""
    most = max(guarded.key_rows) / batch
    if most <= fed + slack:
        return None
    return (f"your function projected {most:.0f} keys per layer for {fed} tokens: a cached decode computes each "
            "token's key and value once and keeps them; recomputing the prefix at every step is what the cache "
            "saves")


@exercise("01.generate_greedy", "Exercise 2 (greedy decoding with the cache)", fallback=_greedy_with_course,
          shortcuts=(sample_batch,))
def _check_generate_greedy(fn) -> None:
    model = tiny_model("llama", seed=2)
    prompt = torch.tensor([[3, 14, 15, 9, 26]])
    n_new = 8
    want = _greedy_by_recomputation(model, prompt, n_new)
    with GuardedModel(model) as guarded:
        got = fn(guarded, prompt, n_new)
    if not isinstance(got, torch.Tensor) or got.dim() != 2:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise Wrong(f"return the token ids as a [1, P + n_new] tensor (prompt included): for a prompt [1, 5] and "
                    f"n_new = {n_new}, shape {tuple(want.shape)}; got {shape}")
    if got.shape[1] != want.shape[1]:
        raise Wrong(f"expected {want.shape[1]} ids (5 prompt + {n_new} new), got {got.shape[1]}: "
                    "check the loop's range (off by one?) and that the prompt is included")
    if not torch.equal(got[:, : prompt.shape[1]], prompt):
        raise Wrong("the returned ids must start with the prompt")
    if any(n > 1 for n in guarded.calls[1:]):
        raise Wrong("after the prompt, feed only the newest token: the cache already holds the rest "
                    f"(your forward calls got {guarded.calls} tokens)")
    recomputed = _keys_per_token(guarded, 1, prompt.shape[1] + n_new - 1, slack=1)
    if recomputed:
        raise Wrong(recomputed)
    if not torch.equal(got, want):
        first = int((got != want).nonzero()[0, 1])
        raise Wrong(f"token {first} differs from greedy decoding without a cache (expected ids "
                    f"{want[0].tolist()}, got {got[0].tolist()}): pass the same cache to every call, and pick argmax "
                    "of the *last* position's logits")


# ----------------------------------------------------------------------------- 4. beyond GQA
_QUANTISED = [("Llama-3-8B (GQA 32:8)", 8, 64), ("Llama-3-8B (GQA 32:8)", 4, 32), ("DeepSeek-V2 (MLA)", 4, 64),
              ("Falcon-7B (MQA 71:1)", 8, 64), ("Llama-2-7B (MHA)", 4, 128)]


def _diagnose_bytes(config: dict, bits: int, group_size: int | None, got: float) -> str | None:
    """The typical mistake that gives ``got``, as a hint (None when none fits)."""
    numbers = cache_numbers_per_token(config)
    latent = "kv_lora_rank" in config
    if latent and got == 2 * kv_bytes_per_token(config, bits, group_size):
        return ("a latent cache stores ONE compressed vector per token and layer (every head's key and value are "
                "re-projected from it): no factor 2 for keys and values")
    no_rope = config["n_layers"] * config["kv_lora_rank"] if latent else 0
    if latent and got in (no_rope * bits // 8, no_rope * bits // 8 + no_rope // (group_size or 1) * 4):
        return "the decoupled RoPE key (rope_dim numbers per token and layer) is cached too"
    if not latent and "n_heads" in config and config["n_heads"] != config["kv_heads"] and got == kv_bytes_per_token(
            {**config, "kv_heads": config["n_heads"]}, bits, group_size):
        return "the cache holds one key and one value per KV head (kv_heads), not per query head (n_heads)"
    if got == numbers * bits:
        return "bits is in bits: divide by 8 to get bytes"
    if bits < 16:
        data = numbers * bits // 8
        if got == data:
            return ("every group of group_size numbers also stores a scale and a zero point (2 bytes each, float16): "
                    "add them")
        if got == data + numbers // group_size * 2:
            return "a group stores a scale AND a zero point, 2 bytes each"
        if got == numbers * 2:
            return "a quantised number takes bits / 8 bytes, not the 2 bytes of float16"
    return None


@exercise("01.kv_bytes_per_token", "Exercise 4 (bytes per token beyond GQA)", fallback=kv_bytes_per_token,
          shortcuts=(kv_bytes_per_token, cache_numbers_per_token, cache_bytes_per_token))
def _check_kv_bytes_per_token(fn) -> None:
    cases = [(name, 16, None) for name in CONFIGS] + _QUANTISED
    for name, bits, group_size in cases:
        config = dict(CONFIGS[name])
        want = kv_bytes_per_token(config, bits, group_size)
        got = fn(dict(config), bits, group_size)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise Wrong(f"return a number of bytes, got {got!r}")
        if got == want:
            continue
        diagnosis = _diagnose_bytes(config, bits, group_size, got)
        where = f"{name}, {bits}-bit" + (f", groups of {group_size}" if group_size else "")
        raise Wrong(f"{where}: {diagnosis}" if diagnosis else f"{where}: expected {want:,} bytes per token, "
                                                               f"got {got!r}")


# ----------------------------------------------------------------------------- 5. build: a GQA layer and its decode loop
@torch.inference_mode()
def _greedy_and_logits_with_course(model, prompt: Tensor, n_new: int) -> tuple[Tensor, Tensor]:
    """AUTOFILL's build: the course's greedy decoding, and the model's logits of every token fed."""
    ids = _greedy_with_course(model, prompt, n_new)
    return ids, model(ids[:, :-1]).logits


def _course_logits(model, ids: Tensor) -> Tensor:
    with torch.inference_mode():
        return model(ids).logits


def _student_logits(fn, model, prompt: Tensor, n_new: int) -> Tensor | None:
    """The logits ``fn`` computes on ``model`` (None when it fails there)."""
    try:
        with GuardedModel(model, whole_forward=False) as guarded:
            return torch.as_tensor(fn(guarded, prompt.clone(), n_new)[1])
    except Exception:  # a probe only narrows the hint down
        return None


def _probe_model(seed: int, kv_heads: int, uniform: bool) -> torch.nn.Module:
    """A tiny Llama for a probe: ``uniform`` zeroes every query (scores 0: every cached key weighs the same)."""
    model = tiny_model("llama", seed=seed, kv_heads=kv_heads)
    if uniform:
        with torch.no_grad():
            for block in model.blocks:
                block.attn.q.weight.zero_()
    return model


def _diagnose_own_attention(fn, prompt: Tensor, n_new: int) -> str:
    """The mistake, narrowed down by probes on models where parts of attention cannot matter."""
    def right_on(model) -> bool:
        got = _student_logits(fn, model, prompt, n_new)
        ids = torch.cat([prompt, _greedy_by_recomputation(model, prompt, n_new)[:, prompt.shape[1]:]], 1)
        return got is not None and close(got, _course_logits(model, ids[:, :-1]), 1e-6)

    if not right_on(_probe_model(7, 4, uniform=True)):
        return hint(3, "even with every query zeroed (all cached keys weigh the same) your logits differ: the cache "
                       "holds the wrong keys and values; append the new token's key and value to the layer's cache "
                       "*before* attending (the token attends to itself), one row per token")
    if not right_on(_probe_model(7, 4, uniform=False)):
        return hint(3, "with uniform attention your logits are right, so the scores are wrong: rotate the query and "
                       "every key at its own position (rope), keys once before caching them, and scale by "
                       "1/sqrt(head_dim)")
    return hint(2, "right when every query head has its own KV head (H_kv = H), wrong with GQA: query head h reads "
                   "KV head h // (H / H_kv), so neighbouring query heads share one: repeat_interleave the KV heads "
                   "(dim 1), not repeat")


@exercise("01.greedy_own_attention", "Build exercise (GQA attention with a cache, and the decode loop)",
          points=6, kind="build", fallback=_greedy_and_logits_with_course, shortcuts=(attend, sample_batch))
def _check_greedy_own_attention(fn) -> None:
    model = tiny_model("llama", seed=7)  # 4 query heads, 2 KV heads: GQA
    prompt = torch.tensor([[5, 17, 2, 40, 33], [8, 1, 29, 12, 50]])
    n_new = 5
    want_ids = _greedy_by_recomputation(model, prompt, n_new)
    oracle = _course_logits(model, want_ids[:, :-1])  # the course's model, one full forward
    fed = prompt.shape[1] + n_new - 1
    with GuardedModel(model, whole_forward=False) as guarded:
        out = fn(guarded, prompt.clone(), n_new)
    if not isinstance(out, tuple) or len(out) != 2:
        got = f"a tuple of {len(out)}" if isinstance(out, tuple) else type(out).__name__
        raise Wrong(hint(2, f"return a tuple (ids, logits), got {got}"))
    ids, logits = (torch.as_tensor(x) for x in out)
    recomputed = _keys_per_token(guarded, prompt.shape[0], fed, slack=1)
    if recomputed:
        raise Wrong(hint(1, recomputed))
    if tuple(logits.shape) != tuple(oracle.shape):
        raise Wrong(hint(2, f"logits must be [batch, tokens fed, vocab] = {tuple(oracle.shape)} (the prompt's "
                            f"{prompt.shape[1]} tokens and the {n_new - 1} generated ones that are fed back), got "
                            f"{tuple(logits.shape)}"))
    if not close(logits, oracle, 1e-6):
        gap = (logits.detach().double() - oracle.double()).abs().amax((0, 2))
        off = ((gap > 1e-6) | gap.isnan()).nonzero()
        row = int(off[0]) if len(off) else 0
        raise Wrong(f"tiny Llama (H = 4, H_kv = 2), prompt [2, 5], n_new = {n_new}: your logits differ from the "
                    f"course's model from row {row} on (max |difference| {float(gap.max()):.3g}); "
                    + _diagnose_own_attention(fn, prompt, n_new))
    if tuple(ids.shape) != tuple(want_ids.shape) or not torch.equal(ids, want_ids):
        raise Wrong(hint(1, "the logits are right but the ids are not: append argmax of the last logits, once per "
                            f"step, and return prompt + {n_new} new ids, shape {tuple(want_ids.shape)}: expected "
                            f"{want_ids[0].tolist()} (row 0), got shape {tuple(ids.shape)}"
                            + (f", {ids[0].tolist()}" if ids.dim() == 2 else "")))
