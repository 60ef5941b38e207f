"""``bench``'s head-wise rows: decode time per token and cache bytes of the head-wise caches (``course.headwise``)
against uniform budgets, after the same prompt, measured side by side in one run (A B A B ..., medians).

Contenders, every one at ``budget`` slots per KV head on average after a ``prompt``-token prompt (equal bytes):
uniform StreamingLLM and SnapKV (the course's policies), DuoAttention-style (``duo_at_bytes``: the heads that look
furthest keep the whole prompt, the others sinks + a window sized so that the total is the same), Ada-KV (SnapKV's
scores, one top-k over a layer's heads) and PyramidKV (SnapKV with budgets shrinking with depth); the full cache
for scale. Times and bytes are given as ratios to uniform SnapKV.

What the head-wise times show: attention runs over one padded view per layer ([B, H_kv, S_max, d], the longest head
decides S_max), so a layer with one retrieval head costs about what the full cache costs there, while its bytes are
the parts' slots only. The bytes are the 16-bit deployment's (``bytes_at(2)``), the same for every contender.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from course.attention_analysis import attention_maps
from course.compression import compress_prompt
from course.models.base import CausalLM
from course.policies import make_policy
from course.timing import alternate

__all__ = ["far_attention", "bench_headwise", "headwise_table"]

SINKS = 4


def far_attention(model: CausalLM, ids: Tensor, window: int, probe: int = 256) -> Tensor:
    """Each KV head's attention mass beyond the sinks and the recent ``window``: [L, H_kv].

    DuoAttention's distinction in one number: a streaming head puts (almost) all of its attention on the first
    ``SINKS`` tokens and the last ``window`` ones. Read from the last query of the first ``probe`` tokens of ``ids``
    [1, T] (a short probe: the maps are [T, T] per head); a KV head takes the largest of its GQA group (one query
    head that looks far is enough to need the far keys)."""
    n = min(probe, ids.shape[1])
    if n <= SINKS + window:
        raise ValueError(f"the probe ({n} tokens) must be longer than the sinks and window ({SINKS} + {window})")
    maps = attention_maps(model, ids[:, :n])  # list of [1, H, n, n]
    far = torch.stack([w[0, :, -1, SINKS : n - window].sum(-1) for w in maps])  # [L, H]
    c = model.config
    return far.reshape(c.n_layer, c.n_kv_head, c.n_head // c.n_kv_head).amax(-1)


def _contenders(model: CausalLM, ids: Tensor, prompt: int, budget: int) -> dict:
    """name -> policy (None: the full cache), every one at ``budget`` slots per KV head on average."""
    from course import headwise

    c = model.config
    scores = far_attention(model, ids, window=budget - SINKS)
    return {"full": None, "streaming": make_policy("streaming", budget, model=model),
            "snapkv": make_policy("snapkv", budget, model=model),
            "duo_attention": headwise.duo_at_bytes(c, scores, prompt, budget, sinks=SINKS),
            "ada_kv": headwise.ada_kv(c, budget), "pyramid_kv": headwise.pyramid_kv(c, budget)}


def _decode(model: CausalLM, cache, token: Tensor, steps: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(steps):
            model(token, cache=cache)
    return run


@torch.inference_mode()
def bench_headwise(model: CausalLM, ids: Tensor, prompt: int, budget: int, steps: int, reps: int) -> dict:
    """Per-token decode time (ms) and cache bytes after the first ``prompt`` tokens of ``ids`` [1, T] are compressed
    to ``budget`` slots per KV head by each contender (module doc); ratios to uniform SnapKV."""
    if not SINKS + 2 <= budget < prompt <= ids.shape[1]:
        raise ValueError(f"need {SINKS + 2} <= budget < prompt <= tokens of ids ({ids.shape[1]}), got budget={budget},"
                         f" prompt={prompt}")
    policies = _contenders(model, ids, prompt, budget)
    caches = {name: compress_prompt(model, ids[:, :prompt], policy)[0] for name, policy in policies.items()}
    sizes = {name: cache.bytes_at(2) for name, cache in caches.items()}  # before the timed steps add tokens
    token = ids[:, prompt : prompt + 1]
    med = alternate({name: _decode(model, cache, token, steps) for name, cache in caches.items()}, reps, 1,
                    model.device)
    rows = {name: {"label": "full" if policies[name] is None else policies[name].label,
                   "ms_per_token": 1e3 * med[name] / steps, "bytes": sizes[name],
                   "time_over_snapkv": med[name] / med["snapkv"], "bytes_over_snapkv": sizes[name] / sizes["snapkv"]}
            for name in caches}
    return {"prompt": prompt, "budget": budget, "rows": rows}


def headwise_table(h: dict) -> str:
    """The head-wise rows as a markdown table."""
    lines = [f"Head-wise caches after a {h['prompt']}-token prompt, {h['budget']} slots per KV head on average "
             "(16-bit bytes), ratios to uniform SnapKV at the same budget:", "",
             "| cache | policy | ms/token | KiB | time / SnapKV | bytes / SnapKV |", "|---|---|---|---|---|---|"]
    for name, r in h["rows"].items():
        lines.append(f"| {name} | {r['label']} | {r['ms_per_token']:.2f} | {r['bytes'] / 1024:.0f} | "
                     f"{r['time_over_snapkv']:.2f} | {r['bytes_over_snapkv']:.2f} |")
    return "\n".join(lines) + "\n"
