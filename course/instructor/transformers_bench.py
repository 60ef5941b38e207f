"""``python -m course bench --transformers-cache``: what a course policy costs inside transformers, and the course's
own decode against transformers'.

At each context, decoders run one token at a time at that context, alternated round by round (A B C A B C ...) so
that a busy machine slows them alike; every ratio is taken round by round and given as the median with its range
(min-max) over the rounds:

* transformers with its plain ``DynamicCache`` holding ``context`` tokens (cropped back after every round, so
  every round decodes at the same context);
* transformers with the course's StreamingLLM policy in a ``PolicyCache`` of ``context`` slots, full (every step
  evicts a token and re-rotates the sinks), at the ``policy_contexts``;
* the course's own model with the same StreamingLLM policy in its ``KVCache`` (its default, fast path), at the
  ``course_contexts``.

Goals: PolicyCache / DynamicCache <= 1.1, course / transformers <= 1.0. Written between markers in
docs/benchmarks.md. ``profile_decode`` profiles one decode step of each (``--profile``).
"""

from __future__ import annotations

import shlex
import statistics
from pathlib import Path

import torch

from course.data import load_text, tokenize
from course.compression import compress_prompt
from course.instructor.bench import machine
from course.instructor.grading.throughput import write_report
from course.models import from_transformers, load_hf_model
from course.policies import make_policy
from course.timing import alternate_times
from course.transformers_cache import PolicyCache, course_config

__all__ = ["bench_transformers_cache", "transformers_cache_table", "write_transformers_cache_report", "profile_decode",
           "POLICY_GOAL", "COURSE_GOAL"]

BEGIN, END = "<!-- transformers-cache:begin -->", "<!-- transformers-cache:end -->"
POLICY_GOAL = 1.1  # PolicyCache / DynamicCache per token
COURSE_GOAL = 1.0  # course decode / transformers' decode per token
NAMES = {"dynamic": "transformers, DynamicCache", "policy": "transformers, PolicyCache", "course": "course model"}


def _decoders(hf, model, ids: torch.Tensor, context: int, steps: int, sinks: int, which: tuple[str, ...]) -> dict:
    """One function per decoder in ``which`` that decodes ``steps`` tokens at ``context`` tokens (each keeps its
    cache at that context), and the caches (for the checks after the timing)."""
    prompt = ids[:, :context]
    fed = dict.fromkeys(which, context)
    fns, caches = {}, {}

    def run(name: str, forward) -> None:
        for _ in range(steps):
            t = fed[name]
            forward(ids[:, t : t + 1])
            fed[name] += 1

    if "dynamic" in which:
        caches["dynamic"] = hf(prompt, use_cache=True).cache

        def with_dynamic() -> None:
            run("dynamic", lambda x: hf(x, cache=caches["dynamic"], use_cache=True))
            caches["dynamic"].crop(-steps)  # back to `context` tokens: every round decodes at the same context
            fed["dynamic"] -= steps

        fns["dynamic"] = with_dynamic
    if "policy" in which:
        caches["policy"] = PolicyCache(hf, make_policy("streaming", context, sinks=sinks, model=course_config(hf)))
        hf(prompt, cache=caches["policy"], use_cache=True)
        fns["policy"] = lambda: run("policy", lambda x: hf(x, cache=caches["policy"], use_cache=True))
    if "course" in which:
        course_policy = make_policy("streaming", context, sinks=sinks, model=model)
        caches["course"], _ = compress_prompt(model, prompt, course_policy, logits_to_keep=1)
        fns["course"] = lambda: run("course", lambda x: model(x, cache=caches["course"]))
    return fns, caches


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


@torch.inference_mode()
def bench_transformers_cache(model_name: str = "smollm2-135m", device: str = "cpu",
                             policy_contexts: tuple[int, ...] = (1024, 8192),
                             course_contexts: tuple[int, ...] = (256, 1024),
                             steps: int = 4, reps: int = 5, sinks: int = 4, progress: bool = True) -> dict:
    """Per-token decode of the decoders at each context; returns times (ms, median and range) and ratios (median
    and range over rounds)."""
    if reps < 5:
        raise ValueError(f"reps must be at least 5 (a median with its range), got {reps}")
    say = print if progress else (lambda *a, **k: None)
    hf, tok = load_hf_model(model_name, attn="sdpa")
    hf = hf.to(device)
    model = from_transformers(hf, model_name)
    contexts = sorted(set(policy_contexts) | set(course_contexts))
    extra = (reps + 2) * steps + 1
    limit = model.config.max_stream_tokens
    if limit is not None and contexts[-1] + extra > limit:
        raise ValueError(f"contexts must leave room for {extra} decoded tokens within {limit} positions, got "
                         f"{contexts[-1]}")
    ids = tokenize(tok, load_text("austen"), contexts[-1] + extra, device)
    rows = []
    for context in contexts:
        which = ("dynamic",) + (("policy",) if context in policy_contexts else ()) + \
            (("course",) if context in course_contexts else ())
        say(f"== context {context}: {', '.join(NAMES[w] for w in which)} (prompts first)", flush=True)
        fns, caches = _decoders(hf, model, ids, context, steps, sinks, which)
        times = alternate_times(fns, reps, 1, torch.device(device))
        for name in ("policy", "course"):
            if name in caches:
                assert caches[name].n_slots == context, "the caches must stay at the budget"
        if "policy" in caches:
            caches["policy"].close()
        ms = {name: _spread([1e3 * t / steps for t in ts]) for name, ts in times.items()}
        ratios = {f"{name}_over_dynamic": _spread([a / b for a, b in zip(times[name], times["dynamic"])])
                  for name in which if name != "dynamic"}
        rows.append({"context": context, "ms_per_token": ms, **ratios})
        say("   " + "; ".join(f"{NAMES[n]} {m['median']:.1f} ms/token" for n, m in ms.items()), flush=True)
        del fns, caches
    return {"model": model.config.name, "device": str(device), "sinks": sinks, "steps": steps, "reps": reps,
            "machine": machine(), "rows": rows}


def _ratio(r: dict) -> str:
    return f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"


def transformers_cache_table(r: dict, command: str) -> str:
    """The result as markdown (the block between the markers)."""
    lines = [
        f"Measured by `{command}`: model {r['model']} on {r['device']} "
        f"({r['machine'].get('gpu') or r['machine']['processor']}, {r['machine']['cpu_threads']} threads), torch "
        f"{r['machine']['torch']}; one token at a time at each context, {r['steps']} tokens per round, "
        f"{r['reps']} alternated rounds; ms per token as the median (range), ratios taken round by round: median "
        f"(range). StreamingLLM: {r['sinks']} sinks, the rest recent, the cache full at the context.",
        "",
        "| context | transformers, `DynamicCache` | transformers, course StreamingLLM in a `PolicyCache` | "
        "course model, course StreamingLLM in its `KVCache` | PolicyCache / DynamicCache | course / transformers |",
        "|---|---|---|---|---|---|",
    ]

    def ms(row: dict, name: str) -> str:
        m = row["ms_per_token"].get(name)
        return "" if m is None else f"{m['median']:.1f} ({m['min']:.1f}-{m['max']:.1f})"

    for row in r["rows"]:
        pol = row.get("policy_over_dynamic")
        cou = row.get("course_over_dynamic")
        lines.append(f"| {row['context']} | {ms(row, 'dynamic')} | {ms(row, 'policy')} | {ms(row, 'course')} | "
                     f"{_ratio(pol) if pol else ''} | {_ratio(cou) if cou else ''} |")
    lines += ["", "| goal | measured (median of the rounds) | verdict |", "|---|---|---|"]
    for row in r["rows"]:
        for key, goal, what in (("policy_over_dynamic", POLICY_GOAL, "PolicyCache / DynamicCache"),
                                ("course_over_dynamic", COURSE_GOAL, "course decode / transformers' decode")):
            if key in row:
                verdict = "meets it" if row[key]["median"] <= goal else "**misses it**"
                lines.append(f"| {what} <= {goal} at {row['context']} tokens | {_ratio(row[key])} | {verdict} |")
    return "\n".join(lines)


def write_transformers_cache_report(result: dict, path: Path, command: str | None = None) -> Path:
    """Write the table between the markers in ``path`` (docs/benchmarks.md)."""
    command = command or shlex.join(["python", "-m", "course", "bench", "--transformers-cache"])
    return write_report(path, transformers_cache_table(result, command), BEGIN, END)


@torch.inference_mode()
def profile_decode(model_name: str = "smollm2-135m", device: str = "cpu", context: int = 1024, steps: int = 4,
                   sinks: int = 4, rows: int = 12) -> str:
    """A profile of one decode step of each decoder at ``context`` tokens (torch.profiler, after a warm-up): wall
    time per token, the time inside torch operators, and the operators that take the most of it."""
    from torch.profiler import ProfilerActivity, profile

    hf, tok = load_hf_model(model_name, attn="sdpa")
    hf = hf.to(device)
    model = from_transformers(hf, model_name)
    ids = tokenize(tok, load_text("austen"), context + 8 * steps + 1, device)  # 5 rounds per decoder
    fns, caches = _decoders(hf, model, ids, context, steps, sinks, ("dynamic", "policy", "course"))
    out = []
    for name, fn in fns.items():
        walls = alternate_times({name: fn}, 3, 1, torch.device(device))[name]
        wall = 1e3 * statistics.median(walls) / steps
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])
        with profile(activities=activities) as prof:
            fn()
        events = prof.key_averages()
        inside = sum(e.self_cpu_time_total for e in events) / 1e3 / steps
        table = events.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=40)
        out.append(f"### {NAMES[name]} (context {context})\n\n{wall:.1f} ms per token (median of 3 rounds, no "
                   f"profiler); inside torch operators (profiled): {inside:.1f} ms per token\n\n```\n{table}\n```")
    caches["policy"].close()
    return "\n\n".join(out)
