"""``python -m course bench --transformers-cache``: what a course policy costs inside transformers.

Three decoders run one token at a time at the same context of ``context`` tokens, alternated (A B C A B C ...)
so that a busy machine slows them alike; medians per token:

* transformers with its plain ``DynamicCache`` holding ``context`` tokens (cropped back after every round, so
  every round decodes at the same context);
* transformers with the course's StreamingLLM policy in a ``PolicyCache`` of ``context`` slots, full (every step
  evicts a token and re-rotates the sinks);
* the course's own model with the same StreamingLLM policy in its ``KVCache``.

Ratios: PolicyCache / DynamicCache (what the policy adds to transformers; goal <= 1.1) and course / transformers
(the course's readable decode against transformers' own). Written between markers in docs/benchmarks.md.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import torch

from course.data import load_text, tokenize
from course.compression import compress_prompt
from course.instructor.bench import machine
from course.instructor.grading.throughput import write_report
from course.models import from_transformers, load_hf_model
from course.policies import make_policy
from course.timing import alternate
from course.transformers_cache import PolicyCache, course_config

__all__ = ["bench_transformers_cache", "transformers_cache_table", "write_transformers_cache_report"]

BEGIN, END = "<!-- transformers-cache:begin -->", "<!-- transformers-cache:end -->"
GOAL = 1.1  # PolicyCache / DynamicCache per token


@torch.inference_mode()
def bench_transformers_cache(model_name: str = "smollm2-135m", device: str = "cpu", context: int = 1024,
                             steps: int = 8, reps: int = 7, sinks: int = 4) -> dict:
    """Per-token decode of the three decoders at ``context`` tokens; returns times (ms) and ratios."""
    hf, tok = load_hf_model(model_name, attn="sdpa")
    hf = hf.to(device)
    model = from_transformers(hf, model_name)
    cfg = course_config(hf)
    limit = model.config.max_stream_tokens
    if limit is not None and context + (reps + 1) * steps > limit:
        raise ValueError(f"context must leave room for the decoded tokens within {limit} positions, got {context}")
    ids = tokenize(tok, load_text("austen"), context + (reps + 2) * steps + 1, device)
    prompt = ids[:, :context]

    dynamic = hf(prompt, use_cache=True).cache
    policy_cache = PolicyCache(hf, make_policy("streaming", context, sinks=sinks, model=cfg))
    hf(prompt, cache=policy_cache, use_cache=True)
    course_cache, _ = compress_prompt(model, prompt, make_policy("streaming", context, sinks=sinks, model=model))
    fed = {"dynamic": context, "policy": context, "course": context}

    def run(name: str, forward) -> None:
        for _ in range(steps):
            t = fed[name]
            forward(ids[:, t : t + 1])
            fed[name] += 1

    def with_dynamic() -> None:
        run("dynamic", lambda x: hf(x, cache=dynamic, use_cache=True))
        dynamic.crop(-steps)  # back to `context` tokens: every round decodes at the same context
        fed["dynamic"] -= steps

    def with_policy() -> None:
        run("policy", lambda x: hf(x, cache=policy_cache, use_cache=True))

    def course() -> None:
        run("course", lambda x: model(x, cache=course_cache))

    med = alternate({"dynamic": with_dynamic, "policy": with_policy, "course": course}, reps, 1, torch.device(device))
    policy_cache.close()
    ms = {k: 1e3 * v / steps for k, v in med.items()}
    assert policy_cache.n_slots == context and course_cache.n_slots == context, "the caches must stay at the budget"
    return {"model": model.config.name, "device": str(device), "context": context, "sinks": sinks, "steps": steps,
            "reps": reps, "machine": machine(), "ms_per_token": ms,
            "policy_over_dynamic": ms["policy"] / ms["dynamic"], "course_over_transformers": ms["course"] / ms["dynamic"],
            "course_over_policy": ms["course"] / ms["policy"]}


def transformers_cache_table(r: dict, command: str) -> str:
    """The result as markdown (the block between the markers)."""
    m, c = r["ms_per_token"], r["context"]
    verdict = "meets" if r["policy_over_dynamic"] <= GOAL else "misses"
    return "\n".join([
        f"Measured by `{command}`: model {r['model']} on {r['device']} "
        f"({r['machine'].get('gpu') or r['machine']['processor']}, {r['machine']['cpu_threads']} threads), torch "
        f"{r['machine']['torch']}; one token at a time at a context of {c} tokens, {r['steps']} tokens per round, "
        f"median of {r['reps']} alternated rounds.",
        "",
        "| decoder | ms / token |",
        "|---|---|",
        f"| transformers, plain `DynamicCache` ({c} tokens) | {m['dynamic']:.1f} |",
        f"| transformers, course StreamingLLM in a `PolicyCache` ({r['sinks']} sinks + {c - r['sinks']}, full) | "
        f"{m['policy']:.1f} |",
        f"| course model, course StreamingLLM in its `KVCache` (same budget) | {m['course']:.1f} |",
        "",
        "| ratio | measured | goal |",
        "|---|---|---|",
        f"| PolicyCache / DynamicCache (transformers) | {r['policy_over_dynamic']:.2f} | <= {GOAL} ({verdict} it) |",
        f"| course decode / transformers' decode (DynamicCache) | {r['course_over_transformers']:.2f} | <= 1.0 |",
        f"| course decode / transformers with the PolicyCache (same policy) | {r['course_over_policy']:.2f} | |",
    ])


def write_transformers_cache_report(result: dict, path: Path, command: str | None = None) -> Path:
    """Write the table between the markers in ``path`` (docs/benchmarks.md)."""
    command = command or shlex.join(["python", "-m", "course", "bench", "--transformers-cache"])
    return write_report(path, transformers_cache_table(result, command), BEGIN, END)
