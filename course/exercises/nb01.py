"""Notebook 01 (the KV cache): references and checkers."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import CallCounter, close, tiny_model
from course.kvcache import cache_bytes_per_token
from course.models.llama import rope
from course.memory import CONFIGS, cache_numbers_per_token, kv_bytes_per_token


# ----------------------------------------------------------------------------- 1. one attention step
def attention_step(q: Tensor, k_new: Tensor, v_new: Tensor, K: Tensor, V: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One decoding step of single-head attention with a KV cache.

    q, k_new, v_new: [d] for the new token; K, V: [t, d] cached so far (t may be 0).
    Returns (output [d], K' [t+1, d], V' [t+1, d]).
    """
    K = torch.cat([K, k_new[None]])  # the new token's key and value join the cache first
    V = torch.cat([V, v_new[None]])
    weights = torch.softmax(K @ q / math.sqrt(q.shape[-1]), dim=0)  # softmax(q K^T / sqrt(d))
    return weights @ V, K, V


@exercise("01.attention_step", "Exercise 1 (attention with a KV cache)", attention_step)
def _check_attention_step(fn) -> None:
    torch.manual_seed(1)
    d, steps = 8, 6
    qs, ks, vs = torch.randn(steps, d) * 2, torch.randn(steps, d) * 2, torch.randn(steps, d)
    K, V = torch.zeros(0, d), torch.zeros(0, d)
    for t in range(steps):
        out = fn(qs[t], ks[t], vs[t], K, V)
        if not isinstance(out, tuple) or len(out) != 3:
            raise Wrong("return a tuple (output, K, V): the output and the grown cache")
        y, K_new, V_new = out
        if tuple(K_new.shape) != (t + 1, d) or tuple(V_new.shape) != (t + 1, d):
            raise Wrong(f"after step {t} the cache must hold {t + 1} rows of size {d} (one per token seen), "
                        f"got K {tuple(K_new.shape)} and V {tuple(V_new.shape)}: append exactly one row per step")
        if not close(K_new[-1], ks[t]) or not close(V_new[-1], vs[t]):
            raise Wrong("the last row of the cache must be the new token's key and value (k_new, v_new)")
        expected = torch.softmax(ks[: t + 1] @ qs[t] / math.sqrt(d), 0) @ vs[: t + 1]
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
            raise Wrong(f"at step {t} the output differs from softmax(K q / sqrt(d)) V "
                        f"(max difference {(torch.as_tensor(y) - expected).abs().max():.3g})")
        K, V = K_new, V_new


# ----------------------------------------------------------------------------- 2. bytes of a cache
def kv_cache_bytes(n_layers: int, kv_heads: int, head_dim: int, tokens: int, batch: int = 1,
                   dtype_bytes: int = 2) -> int:
    """Bytes of a KV cache: 2 (K and V) * layers * kv_heads * head_dim * tokens * batch * bytes per number."""
    return cache_bytes_per_token(n_layers, kv_heads, head_dim, dtype_bytes) * tokens * batch


@exercise("01.kv_cache_bytes", "Exercise 3 (bytes of a KV cache)", kv_cache_bytes)
def _check_kv_cache_bytes(fn) -> None:
    cases = [(30, 3, 64, 1000, 3, 4), (32, 32, 128, 4096, 1, 2), (12, 12, 64, 1024, 8, 2), (40, 8, 128, 7, 3, 1)]
    for case in cases:
        got, want = fn(*case), kv_cache_bytes(*case)
        if got == want:
            continue
        layers, heads, d, t, b, nb = case
        if got == want // nb:
            raise Wrong("that is a count of numbers, not bytes: multiply by dtype_bytes")
        if got * 2 == want:
            raise Wrong("the cache holds keys AND values: multiply by 2")
        if got == want // b:
            raise Wrong("every sequence in the batch has its own cache: multiply by batch")
        if got == want // layers:
            raise Wrong("every layer has its own cache: multiply by n_layers")
        raise Wrong(f"kv_cache_bytes{case} should be {want:,} bytes, got {got!r}")


# ----------------------------------------------------------------------------- 3. greedy decoding
@torch.inference_mode()
def generate_greedy(model, prompt: Tensor, n_new: int) -> Tensor:
    """Greedy decoding with a KV cache: prompt [1, P] -> [1, P + n_new].

    The prompt goes through the model once; after that only the newest token is fed,
    because the cache already holds the keys and values of everything before it.
    """
    cache = model.new_cache(batch=prompt.shape[0])
    logits = model(prompt, cache=cache).logits
    ids = prompt
    for _ in range(n_new):
        next_id = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_id], dim=1)
        logits = model(next_id, cache=cache).logits
    return ids


def _greedy_by_recomputation(model, prompt: Tensor, n_new: int) -> Tensor:
    ids = prompt
    with torch.inference_mode():
        for _ in range(n_new):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@exercise("01.generate_greedy", "Exercise 2 (greedy decoding with the cache)", generate_greedy)
def _check_generate_greedy(fn) -> None:
    model = tiny_model("llama", seed=2)
    prompt = torch.tensor([[3, 14, 15, 9, 26]])
    n_new = 8
    want = _greedy_by_recomputation(model, prompt, n_new)
    counter = CallCounter(model)
    got = fn(counter, prompt, n_new)
    if not isinstance(got, torch.Tensor) or got.dim() != 2:
        raise Wrong("return the token ids as a [1, P + n_new] tensor (prompt included)")
    if got.shape[1] != want.shape[1]:
        raise Wrong(f"expected {want.shape[1]} ids (5 prompt + {n_new} new), got {got.shape[1]}: "
                    "check the loop's range (off by one?) and that the prompt is included")
    if not torch.equal(got[:, : prompt.shape[1]], prompt):
        raise Wrong("the returned ids must start with the prompt")
    if any(n > 1 for n in counter.calls[1:]):
        raise Wrong("after the prompt, feed only the newest token: the cache already holds the rest "
                    f"(your forward calls got {counter.calls} tokens)")
    if not torch.equal(got, want):
        first = int((got != want).nonzero()[0, 1])
        raise Wrong(f"token {first} differs from greedy decoding without a cache: pass the same cache to every "
                    "call, and pick argmax of the *last* position's logits")


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


@exercise("01.kv_bytes_per_token", "Exercise 4 (bytes per token beyond GQA)", kv_bytes_per_token)
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
        hint = _diagnose_bytes(config, bits, group_size, got)
        where = f"{name}, {bits}-bit" + (f", groups of {group_size}" if group_size else "")
        raise Wrong(f"{where}: {hint}" if hint else f"{where}: expected {want:,} bytes per token, got {got!r}")


# ----------------------------------------------------------------------------- 5. build: a GQA layer and its decode loop
@torch.inference_mode()
def greedy_own_attention(model, prompt: Tensor, n_new: int) -> tuple[Tensor, Tensor]:
    """Greedy decoding of the course's Llama with attention written out: every layer's cache, GQA, RoPE.

    The prompt [B, P] is fed one token at a time (no mask needed), then ``n_new`` greedy tokens. Every
    layer keeps its own keys (rotated at their position) and values, [B, H_kv, t, d]; query head h reads
    KV head h // (H / H_kv). The model is only used for its weights and sub-modules, never called whole.
    Returns (ids [B, P + n_new], logits [B, P + n_new - 1, vocab]: one row per token fed).
    """
    return _greedy_decode(model, prompt, n_new)


def _greedy_decode(model, prompt: Tensor, n_new: int, grouping: str = "interleave", scale: bool = True,
                   rotate_keys: bool = True, self_attend: bool = True) -> tuple[Tensor, Tensor]:
    """``greedy_own_attention`` and its typical mistakes (the checker's diagnoses): ``grouping="repeat"``
    gives query head h the KV head h % H_kv; no ``scale``; keys cached without rotation; the new token
    not attending to itself (attending to the cache before appending, itself only when it is empty)."""
    cfg = model.config
    h, hkv, d, theta = cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.rope_theta
    b = prompt.shape[0]
    keys, values = [None] * cfg.n_layer, [None] * cfg.n_layer
    ids, rows = prompt, []
    for t in range(prompt.shape[1] + n_new - 1):
        pos = torch.full((b, 1), t)
        x = model.tok_emb(ids[:, t : t + 1])  # [B, 1, D]
        for i, block in enumerate(model.blocks):
            attn, z = block.attn, block.norm1(x)
            q = rope(attn.q(z).view(b, 1, h, d).transpose(1, 2), pos, theta)  # [B, H, 1, d]
            k = attn.k(z).view(b, 1, hkv, d).transpose(1, 2)  # [B, H_kv, 1, d]
            k = rope(k, pos, theta) if rotate_keys else k
            v = attn.v(z).view(b, 1, hkv, d).transpose(1, 2)
            old_k, old_v = keys[i], values[i]
            keys[i] = k if old_k is None else torch.cat([old_k, k], dim=2)
            values[i] = v if old_v is None else torch.cat([old_v, v], dim=2)
            seen_k, seen_v = (keys[i], values[i]) if self_attend or old_k is None else (old_k, old_v)
            spread = (lambda x: x.repeat_interleave(h // hkv, 1)) if grouping == "interleave" else \
                (lambda x: x.repeat(1, h // hkv, 1, 1))
            scores = q @ spread(seen_k).transpose(-1, -2) / (math.sqrt(d) if scale else 1.0)  # [B, H, 1, t+1]
            y = torch.softmax(scores, dim=-1) @ spread(seen_v)  # [B, H, 1, d]
            x = x + attn.o(y.transpose(1, 2).reshape(b, 1, h * d))
            x = x + block.mlp(block.norm2(x))
        logits = model.lm_head(model.norm(x))[:, -1]  # [B, vocab]
        rows.append(logits)
        if t >= prompt.shape[1] - 1:
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids, torch.stack(rows, dim=1)


class WeightsOnly:
    """A model whose parts may be used (embedding, blocks, norms, head, config) but not the whole forward."""

    def __init__(self, model) -> None:
        self._model = model

    def __call__(self, *args, **kwargs):
        raise RuntimeError("write the forward pass yourself: use model.tok_emb, model.blocks (attn.q/k/v/o, norm1, "
                           "norm2, mlp), model.norm and model.lm_head, not model(...)")

    def new_cache(self, *args, **kwargs):
        raise RuntimeError("keep your own keys and values per layer (lists of tensors), not the course's cache")

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._model, name)


_GQA_MISTAKES = [
    (dict(grouping="repeat"), "GQA: query head h reads KV head h // (H / H_kv), so neighbouring query heads share "
                              "one KV head: repeat_interleave the KV heads (dim 1), not repeat"),
    (dict(scale=False), "scale the scores by 1/sqrt(head_dim) before the softmax"),
    (dict(rotate_keys=False), "rotate every key with RoPE at its own position before caching it (the course's "
                              "rope(k, pos, theta)): the query alone carries no relative position"),
    (dict(self_attend=False), "append the new token's key and value to the layer's cache before attending: the "
                              "token attends to itself too"),
]


@exercise("01.greedy_own_attention", "Build exercise (GQA attention with a cache, and the decode loop)",
          greedy_own_attention, points=3)
def _check_greedy_own_attention(fn) -> None:
    model = tiny_model("llama", seed=7)  # 4 query heads, 2 KV heads: GQA
    prompt = torch.tensor([[5, 17, 2, 40, 33], [8, 1, 29, 12, 50]])
    n_new = 5
    want_ids, want_logits = _greedy_decode(model, prompt, n_new)
    with torch.inference_mode():
        oracle = model(want_ids[:, :-1]).logits  # the course's model, one full forward
    assert close(want_logits, oracle, 1e-9), "the reference must equal the course's model"
    out = fn(WeightsOnly(model), prompt.clone(), n_new)
    if not isinstance(out, tuple) or len(out) != 2:
        raise Wrong("return a tuple (ids, logits)")
    ids, logits = (torch.as_tensor(x) for x in out)
    rows = prompt.shape[1] + n_new - 1
    if tuple(logits.shape) != tuple(oracle.shape):
        raise Wrong(f"logits must be [batch, tokens fed, vocab] = {tuple(oracle.shape)} (the prompt's "
                    f"{prompt.shape[1]} "
                    f"tokens and the {n_new - 1} generated ones that are fed back), got {tuple(logits.shape)}")
    if not close(logits, oracle, 1e-6):
        diffs = (logits.double() - oracle).abs().amax(dim=(0, 2))
        step = int((diffs > 1e-6).nonzero()[0])
        for settings, hint in _GQA_MISTAKES:
            if close(logits, _greedy_decode(model, prompt, n_new, **settings)[1], 1e-6):
                raise Wrong(hint)
        raise Wrong(f"the logits differ from the course's model from token {step} of {rows} on (max difference "
                    f"{float(diffs[step]):.3g}); with one token per step no mask is needed, every cached key is "
                    "attended")
    if tuple(ids.shape) != tuple(want_ids.shape) or not torch.equal(ids, want_ids):
        raise Wrong("the logits are right but the ids are not: append argmax of the last logits, once per step, "
                    f"and return prompt + {n_new} new ids, shape {tuple(want_ids.shape)}")
