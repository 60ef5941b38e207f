"""Speed and memory benchmarks, measured side by side in one process.

Every comparison alternates its contenders (A B A B ...) and reports medians, so that a busy
machine slows both alike and the *ratios* stay meaningful; absolute times are printed for
context only. ``python -m course bench [--quick] [--json]`` runs them all:

* decode: per-token time of the course's model vs transformers' own cached decode (same weights);
* streaming: StreamingLLM decode vs dense window recomputation at the same window;
* evaluator: the exact chunked evaluator vs the token-by-token decode loop (and their NLL difference);
* policies: per-token time and cache bytes vs tokens streamed for full, window, StreamingLLM, H2O
  and SnapKV, plus the overhead of H2O and SnapKV relative to StreamingLLM;
* head-wise caches: DuoAttention-style at equal bytes, Ada-KV and PyramidKV against uniform budgets after the same
  prompt (``course.instructor.headwise_bench``);
* peak memory of the process (RSS on CPU, max allocated on CUDA).

For the policy sweep, the cache is put into the state it has after ``t`` streamed tokens by
writing that many slots (the policy's occupancy) of random keys and values: the cost of a decode
step depends on the number of slots and on the policy's bookkeeping, not on what the keys hold.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import torch

from course.data import load_text, tokenize
from course.models import load_hf_model, load_model
from course.models.base import CausalLM
from course.compression import compress_prompt
from course.instructor.headwise_bench import bench_headwise, headwise_table
from course.policies import make_policy
from course.streaming import decode_stream, exact_stream
from course.timing import alternate, bench_policies, streaming_vs_recompute

__all__ = ["run_bench", "bench_vs_transformers", "bench_evaluator", "peak_memory", "save_report"]


@torch.inference_mode()
def bench_vs_transformers(model: CausalLM, hf, ids: torch.Tensor, context: int, steps: int, reps: int) -> dict:
    """Per-token decode time, course model vs the transformers model it was copied from."""
    dev = model.device
    cache = model.new_cache(1)
    model(ids[:, :context], cache=cache)
    past = hf(ids[:, :context], use_cache=True).cache  # transformers >= 5.24 calls it `cache`
    state = {"ours": context, "hf": context}

    def ours() -> None:
        for _ in range(steps):
            t = state["ours"]
            model(ids[:, t : t + 1], cache=cache)
            state["ours"] += 1

    def theirs() -> None:
        nonlocal past
        for _ in range(steps):
            t = state["hf"]
            past = hf(ids[:, t : t + 1], cache=past, use_cache=True).cache
            state["hf"] += 1

    med = alternate({"course": ours, "transformers": theirs}, reps, 1, dev)
    course_s, hf_s = med["course"] / steps, med["transformers"] / steps
    return {"context": context, "course_ms": 1e3 * course_s, "transformers_ms": 1e3 * hf_s, "ratio": course_s / hf_s}


def bench_evaluator(model: CausalLM, ids: torch.Tensor, policy_factory, chunk: int = 256) -> dict:
    """Tokens per second of the exact evaluator vs the decode loop on the same stream and policy."""
    decoded = decode_stream(model, ids, policy_factory(), progress=False)
    exact = exact_stream(model, ids, policy_factory(), chunk=chunk, progress=False)
    exact_again = exact_stream(model, ids, policy_factory(), chunk=chunk, progress=False)  # warm
    n = ids.shape[1] - 1
    t_exact = min(exact.seconds, exact_again.seconds)
    return {
        "tokens": n, "policy": decoded.label, "decode_tok_s": n / decoded.seconds, "exact_tok_s": n / t_exact,
        "ratio": decoded.seconds / t_exact, "max_nll_diff": float((decoded.nll - exact.nll).abs().max()),
    }


@torch.inference_mode()
def bench_snapkv_prefill(model: CausalLM, ids: torch.Tensor, prompt: int, budget: int, reps: int) -> dict:
    """Prompt processing with SnapKV's selection vs a plain prefill (the one-off cost SnapKV adds)."""
    def plain() -> None:
        model(ids[:, :prompt], cache=model.new_cache(1))

    def snap() -> None:
        compress_prompt(model, ids[:, :prompt], make_policy("snapkv", budget, model=model))

    med = alternate({"plain": plain, "snapkv": snap}, reps, 1, model.device)
    return {"prompt": prompt, "plain_ms": 1e3 * med["plain"], "snapkv_ms": 1e3 * med["snapkv"],
            "ratio": med["snapkv"] / med["plain"]}


def peak_memory(device: torch.device) -> dict:
    """Peak resident memory of this process (MiB), and the CUDA allocator's peak when on a GPU."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 1024**2)
    out = {"peak_rss_mib": rss}
    if device.type == "cuda":
        out["cuda_max_allocated_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def machine() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "cpu_threads": torch.get_num_threads(),
            "cpus": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def run_bench(model_name: str = "smollm2-135m", device: str = "auto", quick: bool = False, progress: bool = True) -> dict:
    """Every benchmark; sizes are smaller with ``quick``. Returns one dict (ratios at the top level)."""
    say = print if progress else (lambda *a, **k: None)
    t0 = time.perf_counter()
    model, tok = load_model(model_name, device, verbose=progress)
    dev = model.device
    ids = tokenize(tok, load_text("austen"), 4096, dev)
    out: dict = {"model": model.config.name, "device": str(dev), "quick": quick, "machine": machine()}

    say("== decode: course model vs transformers")
    hf, _ = load_hf_model(model.config.name, attn="sdpa")
    hf = hf.to(dev)
    out["decode"] = bench_vs_transformers(model, hf, ids, context=256, steps=4 if quick else 8, reps=3 if quick else 7)
    del hf
    say(f"   {out['decode']}")

    say("== StreamingLLM vs dense window recomputation")
    # GPT-2 has no position past its table: its streams and caches are sized to fit (half the table for the cache)
    limit = model.config.max_stream_tokens
    cache_tokens = 1024 if limit is None else limit // 2
    out["streaming"] = streaming_vs_recompute(model, ids, 4, cache_tokens - 4, reps=3 if quick else 5)
    say(f"   {out['streaming']}")

    say("== exact evaluator vs decode loop")
    n = 256 if quick else 1024
    out["evaluator"] = bench_evaluator(model, ids[:, :n], lambda: make_policy("streaming", 128, model=model))
    say(f"   {out['evaluator']}")

    say("== policies vs tokens streamed")
    lengths = [t for t in ([512, 2048, 8192] if quick else [1024, 2048, 5000, 10000, 20000]) if t == model.config.clip_tokens(t)]
    out["policies"] = bench_policies(model, ids, lengths, budget=256, steps=2 if quick else 4, reps=3 if quick else 5)
    say(f"   h2o/streaming {out['policies']['h2o_over_streaming']:.2f}, "
        f"snapkv/streaming {out['policies']['snapkv_over_streaming']:.2f}")
    out["snapkv_prefill"] = bench_snapkv_prefill(model, ids, 1024, 256, reps=3 if quick else 5)

    say("== head-wise caches vs uniform budgets")
    prompt = 512 if quick else 1024
    out["headwise"] = bench_headwise(model, ids, prompt if limit is None else min(prompt, limit // 2),
                                     budget=64 if quick else 128, steps=2 if quick else 4, reps=3 if quick else 5)
    say(f"   {headwise_table(out['headwise'])}")

    out["memory"] = peak_memory(dev)
    out["seconds"] = time.perf_counter() - t0
    out["ratios"] = {
        "course_over_transformers_decode": out["decode"]["ratio"],
        "streaming_speedup_over_recompute": out["streaming"]["speedup"],
        "exact_evaluator_speedup_over_decode": out["evaluator"]["ratio"],
        "h2o_over_streaming_per_token": out["policies"]["h2o_over_streaming"],
        "snapkv_over_streaming_per_token": out["policies"]["snapkv_over_streaming"],
        "snapkv_prefill_over_plain_prefill": out["snapkv_prefill"]["ratio"],
        **{f"{name}_over_snapkv_{what}": row[f"{what}_over_snapkv"] for name, row in out["headwise"]["rows"].items()
           if name in ("duo_attention", "ada_kv", "pyramid_kv") for what in ("time", "bytes")},
        "full_cache_growth_ms": out["policies"]["per_policy"]["full"]["ms_per_token"][-1]
        / out["policies"]["per_policy"]["full"]["ms_per_token"][0],
        "streaming_growth_ms": out["policies"]["per_policy"]["streaming"]["ms_per_token"][-1]
        / out["policies"]["per_policy"]["streaming"]["ms_per_token"][0],
    }
    return out


def save_report(result: dict, folder: Path) -> list[Path]:
    """Write result.json, a markdown table and the plots into ``folder``; return the paths."""
    import matplotlib

    matplotlib.use("Agg")
    from course import plots

    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "result.json", folder / "tables.md"]
    paths[0].write_text(json.dumps(result, indent=1, default=str))
    paths[1].write_text(markdown_tables(result))
    pol = result["policies"]["per_policy"]
    x = pol["full"]["tokens"]
    for key, label, name in (("ms_per_token", "time per token (ms)", "time_vs_tokens.png"),
                             ("cache_bytes", "KV cache (MiB)", "bytes_vs_tokens.png")):
        scale = 1 if key == "ms_per_token" else 2**-20
        fig = plots.lines_plot(x, {p: [v * scale for v in r[key]] for p, r in pol.items()}, "tokens streamed", label,
                               f"{result['model']} on {result['device']}: {label} vs tokens streamed", logx=True,
                               logy=key == "cache_bytes")
        fig.savefig(folder / name, dpi=110)
        paths.append(folder / name)
    return paths


def markdown_tables(r: dict) -> str:
    d, s, e, p = r["decode"], r["streaming"], r["evaluator"], r["policies"]
    lines = [
        f"Model {r['model']} on {r['device']} ({r['machine'].get('gpu') or r['machine']['processor']}, "
        f"{r['machine']['cpu_threads']} threads), torch {r['machine']['torch']}; quick={r['quick']}.",
        "",
        "| comparison | A | B | ratio A/B | goal |",
        "|---|---|---|---|---|",
        f"| decode, {d['context']}-token context | course {d['course_ms']:.1f} ms/token | transformers "
        f"{d['transformers_ms']:.1f} ms/token | {d['ratio']:.2f} | <= 1.1 |",
        f"| cache of {s['cache_tokens']} tokens | recomputation {1e3 * s['recompute']:.1f} ms/token | StreamingLLM "
        f"{1e3 * s['streaming']:.1f} ms/token | {s['speedup']:.1f}x | >= 20x (paper: up to 22.2x) |",
        f"| {e['tokens']} tokens, {e['policy']} | exact evaluator {e['exact_tok_s']:.0f} tok/s | decode loop "
        f"{e['decode_tok_s']:.1f} tok/s | {e['ratio']:.1f}x (max NLL diff {e['max_nll_diff']:.1e}) | >= 20x, <= 1e-4 |",
        f"| SnapKV prompt of {r['snapkv_prefill']['prompt']} tokens | SnapKV prefill + selection "
        f"{r['snapkv_prefill']['snapkv_ms']:.0f} ms | plain prefill {r['snapkv_prefill']['plain_ms']:.0f} ms | "
        f"{r['snapkv_prefill']['ratio']:.2f} | |",
        "",
        f"Per-token decode time (ms) and cache (MiB) after t streamed tokens, budget {p['budget']} slots:",
        "",
        "| policy | " + " | ".join(f"t={t}" for t in p["per_policy"]["full"]["tokens"]) + " |",
        "|---|" + "---|" * len(p["per_policy"]["full"]["tokens"]),
    ]
    for name, row in p["per_policy"].items():
        cells = [f"{ms:.1f} ms / {b / 2**20:.1f} MiB" for ms, b in zip(row["ms_per_token"], row["cache_bytes"])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"SnapKV compresses the first {p['per_policy']['snapkv']['tokens'][0]} tokens (the prompt) to "
              f"{p['budget']} slots and then keeps every decoded token, so its cache grows again.",
              f"Per token at the same budget: H2O / StreamingLLM {p['h2o_over_streaming']:.2f} (longest stream); "
              f"SnapKV / StreamingLLM {p['snapkv_over_streaming']:.2f} (right after the prompt).", "",
              headwise_table(r["headwise"]),
              f"Peak memory: {', '.join(f'{k} {v:.0f}' for k, v in r['memory'].items())}; total {r['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"
