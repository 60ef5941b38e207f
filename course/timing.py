"""Timing helpers: medians of alternating repetitions, measured side by side."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from course.models.base import CausalLM
from course.policies import POLICIES, Policy, PolicyKind, make_policy, policy_names

__all__ = ["median_seconds", "alternate", "alternate_times", "decode_cost_vs_context", "streaming_vs_recompute",
           "bench_policies", "compressed_prompt_speedup", "synchronize", "count_flops"]


def synchronize(device: torch.device | None) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so that a clock reading means something."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def count_flops(fn: Callable[[], object]) -> int:
    """Floating-point operations of the matrix products ``fn()`` runs, counted by torch (not timed: the same
    number on a busy machine). Fused attention kernels on the CPU are not counted; the weights' products are."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def output_matrix_flops(model: CausalLM) -> int:
    """FLOPs of the output matrix (final hidden state -> vocabulary logits) at one position: the part of a
    forward with ``logits_to_keep=1`` that does not grow with the tokens. Small models spend most of their
    weight work there (SmolLM2: a fifth of its weights; a 128-wide model with SmolLM2's vocabulary: most)."""
    x = torch.zeros(1, 1, model.config.d_model, device=model.device, dtype=next(model.parameters()).dtype)
    with torch.inference_mode():
        return count_flops(lambda: model.lm_head(x))


def median_seconds(fn: Callable[[], object], reps: int = 5, warmup: int = 1, device: torch.device | None = None) -> float:
    """Median wall time of ``fn()`` over ``reps`` runs after ``warmup`` runs."""
    return alternate({"fn": fn}, reps, warmup, device)["fn"]


def alternate(fns: dict[str, Callable[[], object]], reps: int = 5, warmup: int = 1,
              device: torch.device | None = None) -> dict[str, float]:
    """Median seconds of several functions, run in alternation (A B A B ...) so that a noisy
    machine slows them alike and their ratios stay meaningful."""
    return {name: statistics.median(ts) for name, ts in alternate_times(fns, reps, warmup, device).items()}


def alternate_times(fns: dict[str, Callable[[], object]], reps: int = 5, warmup: int = 1,
                    device: torch.device | None = None) -> dict[str, list[float]]:
    """Every repetition's seconds of several functions run in alternation (``alternate`` takes their medians):
    the ratio of two functions' i-th times is one measurement of their ratio, n = ``reps``."""
    if reps < 1 or warmup < 0:
        raise ValueError(f"reps must be >= 1 and warmup >= 0, got {reps}, {warmup}")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append(time.perf_counter() - t0)
    return times


@torch.inference_mode()
def decode_cost_vs_context(model: CausalLM, ids: torch.Tensor, contexts: list[int], reps: int = 5) -> dict:
    """Seconds to produce one next token at each context length, with and without a KV cache.

    cached: one decode step on a cache already holding ``T`` tokens;
    recompute: one full forward over the ``T + 1`` tokens (what decoding without a cache does; the output
    matrix only at the last position, the one that picks the next token).
    Returns {"context": [...], "cached": [...], "recompute": [...]} (seconds per token, medians of
    alternating runs), "cached_flops", "recompute_flops" (counted: the same on any machine) and "output_flops"
    (``output_matrix_flops``: the part of either that is the output matrix, the same at every context).
    """
    if max(contexts) + 1 > ids.shape[1]:
        raise ValueError(f"ids has {ids.shape[1]} tokens; contexts up to {max(contexts)} need {max(contexts) + 1}")
    model.config.check_tokens(max(contexts) + 1, f"decoding after a context of {max(contexts)} tokens")
    out: dict = {"context": [], "cached": [], "recompute": [], "cached_flops": [], "recompute_flops": [],
                 "output_flops": output_matrix_flops(model)}
    dev = model.device
    for t in contexts:
        cache = model.new_cache(1)
        model(ids[:, :t], cache=cache, logits_to_keep=1)  # only the cache is wanted
        nxt = ids[:, t : t + 1]

        def cached_step() -> None:
            model(nxt, cache=cache)
            cache.rewind(t)  # undo the step: keep the context at T

        def recompute() -> None:
            model(ids[:, : t + 1], logits_to_keep=1)

        med = alternate({"cached": cached_step, "recompute": recompute}, reps, 1, dev)
        out["cached_flops"].append(count_flops(cached_step))
        out["recompute_flops"].append(count_flops(recompute))
        out["context"].append(t)
        out["cached"].append(med["cached"])
        out["recompute"].append(med["recompute"])
    return out


@torch.inference_mode()
def streaming_vs_recompute(model: CausalLM, ids: torch.Tensor, n_sink: int, window: int, reps: int = 5,
                           steps: int = 1) -> dict:
    """Per-token seconds of StreamingLLM decoding vs dense window recomputation, side by side.

    streaming: a decode step on a full [n_sink | window] cache (one eviction in place per token);
    recompute: a fresh forward over the last ``n_sink + window`` tokens (the paper's baseline; the output
    matrix only at the last position, the one that predicts the next token).
    ``ids`` needs at least n_sink + window + (reps + 3) * steps + 1 tokens. Returns per-token seconds, "speedup",
    "flops_ratio" (counted weight work of a recomputation over a streaming step) and "block_flops_ratio" (the
    same without the output matrix, which both run once: the work that grows with the window).
    """
    from course.policies import make_policy

    budget = n_sink + window
    need = budget + (reps + 3) * steps + 1  # warm-up, repetitions and the counted step
    if ids.shape[1] < need:
        raise ValueError(f"ids has {ids.shape[1]} tokens; this measurement needs {need}")
    model.config.check_tokens(need, f"timing a {budget}-token cache")
    cache = model.new_cache(1, make_policy("streaming", budget, sinks=n_sink, model=model))
    model(ids[:, :budget], cache=cache, logits_to_keep=1)  # only the cache is wanted
    t = {"next": budget}

    def stream() -> None:
        for _ in range(steps):
            model(ids[:, t["next"] : t["next"] + 1], cache=cache)
            t["next"] += 1

    def recompute() -> None:
        for _ in range(steps):
            model(ids[:, t["next"] - budget + 1 : t["next"] + 1], logits_to_keep=1)

    times = alternate_times({"streaming": stream, "recompute": recompute}, reps, 1, model.device)
    per_token = {k: statistics.median(v) / steps for k, v in times.items()}
    flops = {"recompute": count_flops(recompute), "stream": count_flops(stream)}  # the next step: the same anywhere
    head = output_matrix_flops(model)
    return {**per_token, "speedup": per_token["recompute"] / per_token["streaming"], "cache_tokens": budget,
            "flops_ratio": flops["recompute"] / flops["stream"],
            "block_flops_ratio": (flops["recompute"] - head) / (flops["stream"] - head),
            "speedups": [r / s for r, s in zip(times["recompute"], times["streaming"])]}  # one per repetition


def _fill(model: CausalLM, policy: Policy, slots: int, seen: int):
    """A cache in the state ``policy`` leaves after ``seen`` tokens: ``slots`` random entries."""
    cache = model.new_cache(1, policy)
    c = model.config
    g = torch.Generator(device="cpu").manual_seed(0)
    positions = torch.arange(seen - slots, seen)
    positions[: min(4, slots)] = torch.arange(min(4, slots))  # keep the first tokens (sinks) where they would be
    shape = (1, c.n_kv_head, slots, c.head_dim)
    stats = {name: torch.rand(1, c.n_kv_head, slots, generator=g) for name in policy.eviction_stats}
    cache.fill(torch.randn(shape, generator=g).to(model.device), torch.randn(shape, generator=g).to(model.device),
               positions.to(model.device)[None], seen, {k: v.to(model.device) for k, v in stats.items()})
    return cache


def _decode_steps(model: CausalLM, cache, token: torch.Tensor, steps: int) -> Callable[[], None]:
    """A function that decodes ``token`` ([1, 1]) ``steps`` times through ``cache`` (what the timings repeat)."""
    def run() -> None:
        for _ in range(steps):
            model(token, cache=cache)
    return run


def _slots_after(kind: PolicyKind, t: int, budget: int, prompt: int) -> int:
    """Slots a policy holds after ``t`` tokens: every token (the full cache), the prompt compressed to ``budget``
    and every token decoded since (a policy that only compresses the prompt), else at most ``budget``."""
    if not kind.bounded:
        return t
    return budget + (t - prompt) if kind.prefill_only else min(t, budget)


@torch.inference_mode()
def bench_policies(model: CausalLM, ids: torch.Tensor, lengths: list[int], budget: int, steps: int, reps: int,
                   names: tuple[str, ...] | None = None, storage=None) -> dict:
    """Per-token decode time (ms) and cache bytes after ``t`` streamed tokens, for every policy in ``names``
    (by default the table's policies shown in ``bench``: full, window, streaming, h2o, snapkv and any registered
    since; any registered policy may be added).

    SnapKV compresses a prompt once and never evicts while decoding: here the prompt is the first
    ``lengths[0]`` tokens, compressed to ``budget`` slots, and its cache then grows by one slot a
    token. Its overhead is therefore compared at ``lengths[0]``, where it holds ``budget`` slots
    like StreamingLLM; H2O's at the longest stream (both always hold ``budget``). ``storage``: a store
    (``course.storage``) every policy keeps its tokens in (default: full precision)."""
    if list(lengths) != sorted(lengths) or lengths[0] < budget:
        raise ValueError(f"lengths must be increasing and start at >= budget ({budget}), got {lengths}")
    names = policy_names("bench") if names is None else tuple(names)
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not {"streaming", "h2o", "snapkv"} <= set(names):  # the overheads below compare these
        raise ValueError(f"names must include streaming, h2o and snapkv and may add any of {', '.join(POLICIES)}; "
                         f"got {names}")
    policies = {name: (lambda name=name: make_policy(name, budget, model=model, quantizer=storage))
                for name in names}  # SnapKV compresses the prompt; its cache then grows while decoding
    prompt = lengths[0]  # SnapKV: this prompt compressed to the budget, then decoding
    rows: dict[str, dict[str, list]] = {name: {"tokens": [], "ms_per_token": [], "cache_bytes": []} for name in policies}
    for t in lengths:
        occupancy = {name: _slots_after(POLICIES[name], t, budget, prompt) for name in names}
        fns, sizes = {}, {}
        for name, make in policies.items():
            cache = _fill(model, make(), occupancy[name], t)
            sizes[name] = cache.nbytes  # before the timed steps add their tokens
            fns[name] = _decode_steps(model, cache, ids[:, :1], steps)
        med = alternate(fns, reps, 1, model.device)
        for name in policies:
            rows[name]["tokens"].append(t)
            rows[name]["ms_per_token"].append(1e3 * med[name] / steps)
            rows[name]["cache_bytes"].append(sizes[name])
    ms = {name: r["ms_per_token"] for name, r in rows.items()}
    return {"budget": budget, "per_policy": rows,
            "h2o_over_streaming": ms["h2o"][-1] / ms["streaming"][-1],
            "snapkv_over_streaming": ms["snapkv"][0] / ms["streaming"][0]}


@torch.inference_mode()
def compressed_prompt_speedup(model: CausalLM, lengths: list[int], budget: int, steps: int = 4, reps: int = 5) -> dict:
    """Per-token decode time after a prompt of each length in ``lengths``: with the prompt's whole cache
    (``full``) and with the ``budget`` slots SnapKV compresses it to (``snapkv``, the course's policy), side by
    side. The slots hold random keys and values: the cost of a step depends on how many slots there are, not
    on what they hold, so no prompt has to be run. Both caches then grow by one slot a decoded token.

    Returns {"tokens": lengths, "budget", "full_ms", "snapkv_ms" (medians of alternating runs, per token),
    "speedup" (full / snapkv, per length), "speedups" (per length, one full / snapkv ratio per repetition),
    "full_bytes", "snapkv_bytes" (cache bytes before the timed steps)}."""
    lengths = list(lengths)
    if not lengths or lengths != sorted(set(lengths)) or lengths[0] <= budget:
        raise ValueError(f"lengths must be increasing and above the budget ({budget}), got {lengths}")
    if budget < 1 or steps < 1 or reps < 1:
        raise ValueError(f"budget, steps and reps must be >= 1, got {budget}, {steps}, {reps}")
    model.config.check_tokens(lengths[-1] + (reps + 1) * steps, "decoding after the longest prompt")
    token = torch.zeros(1, 1, dtype=torch.long, device=model.device)
    out: dict[str, list] = {"full_ms": [], "snapkv_ms": [], "speedup": [], "speedups": [], "full_bytes": [],
                            "snapkv_bytes": []}
    for t in lengths:
        caches = {"full": _fill(model, make_policy("full"), t, t),
                  "snapkv": _fill(model, make_policy("snapkv", budget, model=model), budget, t)}

        for name, cache in caches.items():
            out[f"{name}_bytes"].append(cache.nbytes)
        times = alternate_times({name: _decode_steps(model, cache, token, steps) for name, cache in caches.items()},
                                reps, 1, model.device)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        out["full_ms"].append(1e3 * med["full"] / steps)
        out["snapkv_ms"].append(1e3 * med["snapkv"] / steps)
        out["speedup"].append(med["full"] / med["snapkv"])
        out["speedups"].append([f / s for f, s in zip(times["full"], times["snapkv"])])
    return {"tokens": lengths, "budget": budget, **out}
