"""Evaluations beyond perplexity: needle retrieval under a compressed cache, and budget sweeps.

Needle in a haystack (a passkey): a five-digit key is hidden at a chosen depth of a stretch of
Austen, and the prompt ends by asking for it, phrased so that the answer continues the text:

    ... filler ... The secret passkey is 48213. Remember it: the passkey is 48213. ... filler ...
    What is the secret passkey? The secret passkey is| 48213

A 135M-parameter model answers this reliably with its full cache (measured: 100 % up to 1000
tokens), so a failure under a policy is the policy's fault. The protocol is prompt compression,
as in SnapKV and kvpress, and it is the same code for every policy (``compress_prompt``): the
prompt (but its last token) runs with full causal attention, whatever the policy, the cache is
compressed to the budget, and then the last prompt token and the answer are decoded one token at a
time through the compressed cache (policies that evict while decoding keep evicting).

Scores: exact match (every answer token is the model's top choice, i.e. greedy decoding would
produce the answer) and the answer's log-probability, which still moves when a small model's
greedy answer is wrong.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from torch import Tensor

from course.data import load_text
from course.kvcache import KVCache
from course.models.base import CausalLM
from course.policies import Policy, make_policy
from course.progress import progress_bar

__all__ = [
    "NeedleTrial", "make_needle_trials", "score_needle", "needle_eval", "budget_sweep", "decode_after_compression",
    "continuation_nll", "compress_prompt",
]

QUESTION = "\nWhat is the secret passkey? The secret passkey is"
NEEDLE_OVERHEAD = 48  # tokens the needle sentence, the question and the answer add (at most, for the course's tokenizers)


@dataclass
class NeedleTrial:
    """prompt: [1, P] token ids; answer: [A] ids; needle: (first, last + 1) token positions of the key sentence."""

    prompt: Tensor
    answer: Tensor
    needle: tuple[int, int]
    depth: float
    key: str


def make_needle_trials(
    tokenizer, n_trials: int, context_tokens: int = 500, depth: float = 0.5, seed: int = 0,
    book: str = "emma", model: CausalLM | None = None,
) -> list[NeedleTrial]:
    """``n_trials`` passkey prompts: ~``context_tokens`` of filler with the needle at ``depth`` (0..1).

    With ``model``, prompts that would not fit its positions (prompt + answer) are refused before any work."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be between 0 and 1, got {depth}")
    if n_trials < 1 or context_tokens < 16:
        raise ValueError(f"n_trials must be >= 1 and context_tokens >= 16, got {n_trials}, {context_tokens}")
    if model is not None:  # the needle, the question and the answer add about NEEDLE_OVERHEAD tokens
        model.config.check_tokens(context_tokens + NEEDLE_OVERHEAD, f"a passkey prompt of {context_tokens} filler tokens")
    rng = random.Random(seed)
    filler = tokenizer(load_text("austen", book), add_special_tokens=False).input_ids
    if len(filler) < context_tokens + 10:
        raise ValueError(f"the filler text has only {len(filler)} tokens, fewer than context_tokens={context_tokens}")
    trials = []
    for _ in range(n_trials):
        key = str(rng.randint(10000, 99999))
        start = rng.randint(0, len(filler) - context_tokens - 1)
        hay = filler[start : start + context_tokens]
        cut = int(round(depth * context_tokens))
        before = tokenizer(tokenizer.decode(hay[:cut]), add_special_tokens=False).input_ids
        needle = tokenizer(f" The secret passkey is {key}. Remember it: the passkey is {key}. ",
                           add_special_tokens=False).input_ids
        after = tokenizer(tokenizer.decode(hay[cut:]) + QUESTION, add_special_tokens=False).input_ids
        answer = tokenizer(" " + key, add_special_tokens=False).input_ids
        ids = before + needle + after
        if len(ids) + len(answer) > context_tokens + NEEDLE_OVERHEAD:
            raise RuntimeError(f"a passkey prompt came out {len(ids) + len(answer) - context_tokens} tokens longer than "
                               f"its filler; NEEDLE_OVERHEAD ({NEEDLE_OVERHEAD}) must cover it")
        trials.append(NeedleTrial(torch.tensor([ids]), torch.tensor(answer), (len(before), len(before) + len(needle)),
                                  depth, key))
    return trials


@torch.inference_mode()
def compress_prompt(model: CausalLM, prompt: Tensor, policy: Policy | None,
                    cache: KVCache | None = None) -> tuple[KVCache, Tensor]:
    """The one prompt-compression step of the course, for every policy.

    prompt: [B, P]. The prompt runs with full causal attention through a cache managed by ``policy``
    (which reads the attention it needs: H2O accumulates it, SnapKV's observation window votes), then
    the cache is compressed to the policy's budget. ``cache``: continue one (a chat's next turn; its own
    policy applies) instead of a new one. Returns the cache and the prompt's logits [B, P, V]."""
    prompt = prompt.to(model.device)
    model.config.check_tokens(prompt.shape[1] + (cache.seen if cache is not None else 0), "the prompt")
    if cache is None:
        cache = model.new_cache(prompt.shape[0], policy, chunks="prompt")
    logits = model(prompt, cache=cache).logits
    cache.compress()
    return cache, logits


@torch.inference_mode()
def decode_after_compression(model: CausalLM, prompt: Tensor, continuation: Tensor, policy: Policy | None,
                             inspect=None) -> tuple[Tensor, Tensor, dict]:
    """The prompt-compression protocol, for any policy.

    prompt [B, P], continuation [B, N]: the prompt but its last token is compressed by
    ``compress_prompt``, then the last prompt token and the continuation are fed one token at a time
    (the policy keeps evicting if it does so while decoding). Returns the log-probability of every
    continuation token [B, N], whether it was the model's top choice [B, N], and ``inspect(cache)``
    taken right after compression (or {}).
    """
    model.config.check_tokens(prompt.shape[1] + continuation.shape[1], "prompt + continuation")
    continuation = continuation.to(model.device)
    cache, _ = compress_prompt(model, prompt[:, :-1], policy)
    info = inspect(cache) if inspect is not None else {}
    feed = torch.cat([prompt[:, -1:].to(model.device), continuation[:, :-1]], dim=1)
    logps, top = [], []
    for i in range(feed.shape[1]):
        lp = torch.log_softmax(model(feed[:, i : i + 1], cache=cache).logits[:, -1].float(), -1)
        logps.append(lp.gather(-1, continuation[:, i : i + 1])[:, 0])
        top.append(lp.argmax(-1) == continuation[:, i])
    return torch.stack(logps, 1).cpu(), torch.stack(top, 1).cpu(), info


def score_needle(model: CausalLM, trial: NeedleTrial, policy: Policy | None = None) -> dict:
    """Compress the prompt's cache with ``policy`` and score the answer. Returns exact (bool),
    logprob (sum over answer tokens), needle_kept (share of the needle's tokens still cached, mean
    over layers and KV heads, right after compression) and cache_slots."""
    lo, hi = trial.needle

    def needle_kept(cache) -> dict:
        kept = torch.stack([((layer.live()[2] >= lo) & (layer.live()[2] < hi)).float().sum(-1) / (hi - lo)
                            for layer in cache.layers]).mean().item()
        return {"needle_kept": kept, "cache_slots": cache.n_slots}

    logps, top, info = decode_after_compression(model, trial.prompt, trial.answer[None], policy, needle_kept)
    return {"exact": bool(top.all()), "logprob": float(logps.sum()), **info}


def continuation_nll(model: CausalLM, ids: Tensor, context: int, policy: Policy | None = None) -> Tensor:
    """NLL [B, N] of the last N = T - context tokens of ``ids`` [B, T] after compressing the first
    ``context`` tokens' cache with ``policy`` (the same protocol as the needle task)."""
    if not 1 < context < ids.shape[1]:
        raise ValueError(f"context must be between 2 and {ids.shape[1] - 1} (ids has {ids.shape[1]} tokens), got {context}")
    logps, _, _ = decode_after_compression(model, ids[:, :context], ids[:, context:], policy)
    return -logps


def _check_trials(model: CausalLM, trials: list[NeedleTrial]) -> None:
    if not trials:
        raise ValueError("trials is empty: make some with make_needle_trials")
    longest = max(t.prompt.shape[1] + t.answer.shape[0] for t in trials)
    model.config.check_tokens(longest, "the longest passkey prompt + answer")


def needle_eval(model: CausalLM, trials: list[NeedleTrial], policy_for: callable, progress: bool = True) -> dict:
    """Score every trial with a fresh policy from ``policy_for(trial)`` (policies hold state).

    Returns accuracy, mean_answer_logprob, mean needle_kept and the per-trial rows."""
    _check_trials(model, trials)
    rows = [score_needle(model, t, policy_for(t)) for t in progress_bar(trials, desc="needle", enabled=progress)]
    n = len(rows)
    return {
        "accuracy": sum(r["exact"] for r in rows) / n,
        "mean_answer_logprob": sum(r["logprob"] for r in rows) / n,
        "needle_kept": sum(r["needle_kept"] for r in rows) / n,
        "answer_prob": math.exp(sum(r["logprob"] for r in rows) / n),
        "trials": rows,
    }


def budget_sweep(model: CausalLM, trials: list[NeedleTrial], policy: str, budgets: list[int], sinks: int | None = None,
                 progress: bool = True, positions: str | None = None) -> list[dict]:
    """Needle results of one policy (a ``make_policy`` name) at several budgets (slots per KV head).

    ``sinks``: pinned first tokens (None: the policy's default, 4 for StreamingLLM, else 0); ``positions``:
    the position rule (None: what the model allows)."""
    _check_trials(model, trials)

    def make(b: int) -> Policy:
        return make_policy(policy, b, sinks=sinks, positions=positions, model=model)

    for b in budgets:  # validate every budget before spending time
        make(b)
    out = []
    for b in budgets:
        r = needle_eval(model, trials, lambda t, b=b: make(b), progress)
        out.append({"policy": policy, "budget": b, "sinks": sinks, **{k: v for k, v in r.items() if k != "trials"}})
    return out
