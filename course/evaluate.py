"""Evaluations beyond perplexity: needle retrieval under a compressed cache, and budget sweeps.

Needle in a haystack (a passkey): a five-digit key is hidden at a chosen depth of a stretch of
Austen, and the prompt ends by asking for it, phrased so that the answer continues the text:

    ... filler ... The secret passkey is 48213. Remember it: the passkey is 48213. ... filler ...
    What is the secret passkey? The secret passkey is| 48213

A 135M-parameter model answers this with its full cache most of the time (it misses one key now and
then), so the notebooks check that the full cache solves a task before they blame a policy. The protocol is prompt compression,
as in SnapKV and kvpress, and it is the same code for every policy (``course.compression``): the
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
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from course.compression import compress_prompts
from course.data import load_split_text
from course.frontier import DEPLOYED_BYTES, held_fraction
from course.kvcache import CacheStack
from course.models.base import CausalLM
from course.policies import Policy, make_policy
from course.progress import progress_bar
from course.splits import split_seed

__all__ = [
    "NeedleTrial", "make_needle_trials", "score_needle", "needle_eval", "compare_needles", "budget_sweep",
    "decode_after_compression", "compare_after_compression", "continuation_nll", "compare_continuations",
    "best_policy",
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
    book: str = "emma", model: CausalLM | None = None, split: str | None = None,
) -> list[NeedleTrial]:
    """``n_trials`` passkey prompts: ~``context_tokens`` of filler with the needle at ``depth`` (0..1).

    The filler comes from ``split``'s characters of ``book`` and the keys and places from ``split``'s seed
    (``course.splits``; None: ``COURSE_SPLIT``, confirmation by default). With ``model``, prompts that would not
    fit its positions (prompt + answer) are refused before any work."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be between 0 and 1, got {depth}")
    if n_trials < 1 or context_tokens < 16:
        raise ValueError(f"n_trials must be >= 1 and context_tokens >= 16, got {n_trials}, {context_tokens}")
    if model is not None:  # the needle, the question and the answer add about NEEDLE_OVERHEAD tokens
        model.config.check_tokens(context_tokens + NEEDLE_OVERHEAD, f"a passkey prompt of {context_tokens} filler tokens")
    rng = random.Random(split_seed(seed, split))
    filler = tokenizer(load_split_text(book, split)[0], add_special_tokens=False).input_ids
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
def compare_after_compression(model: CausalLM, prompt: Tensor, continuation: Tensor,
                              contenders: Mapping[Hashable, Policy | None], inspect=None,
                              inspect_first=None) -> dict[Hashable, tuple]:
    """The prompt-compression protocol for several policies, from one shared prompt forward.

    prompt [B, P], continuation [B, N]: the prompt but its last token is compressed by
    ``compress_prompts`` (one forward for all contenders), then the last prompt token and the
    continuation are fed one token at a time through each contender's compressed cache (a policy
    keeps evicting if it does so while decoding). The contenders decode side by side, one forward per
    token for all of them (``course.kvcache.CacheStack``: each row attends to its own cache only).
    Returns, per contender, the log-probability of every continuation token [B, N], whether it was
    the model's top choice [B, N], and ``inspect(cache)`` taken right after compression merged with
    ``inspect_first(cache)`` taken once the prompt's last token is in the cache (or {}).
    """
    model.config.check_tokens(prompt.shape[1] + continuation.shape[1], "prompt + continuation")
    continuation = continuation.to(model.device)
    names = list(contenders)
    caches, _ = compress_prompts(model, prompt[:, :-1], [contenders[n] for n in names], logits_to_keep=1)
    infos = [inspect(cache) if inspect is not None else {} for cache in caches]
    feed = torch.cat([prompt[:, -1:].to(model.device), continuation[:, :-1]], dim=1).repeat(len(caches), 1)
    targets = continuation.repeat(len(caches), 1)                     # [n·B, N]: contender i's rows i·B...(i+1)·B
    stack = CacheStack(caches)
    logps, top = [], []
    for i in range(feed.shape[1]):
        lp = torch.log_softmax(model(feed[:, i : i + 1], cache=stack).logits[:, -1].float(), -1)   # [n·B, V]
        logps.append(lp.gather(-1, targets[:, i : i + 1])[:, 0])
        top.append(lp.argmax(-1) == targets[:, i])
        if i == 0 and inspect_first is not None:
            infos = [info | inspect_first(cache) for info, cache in zip(infos, caches)]
    rows = continuation.shape[0]
    return {name: (lp, hit, info) for name, lp, hit, info in zip(
        names, torch.stack(logps, 1).cpu().split(rows), torch.stack(top, 1).cpu().split(rows), infos)}


def decode_after_compression(model: CausalLM, prompt: Tensor, continuation: Tensor, policy: Policy | None,
                             inspect=None) -> tuple[Tensor, Tensor, dict]:
    """``compare_after_compression`` for one policy: (log-probs [B, N], top choice [B, N], inspect's dict)."""
    return compare_after_compression(model, prompt, continuation, {0: policy}, inspect)[0]


def _needle_scores(result: tuple) -> dict:
    logps, top, info = result
    return {"exact": bool(top.all()), "logprob": float(logps.sum()), **info}


def _needle_kept(trial: NeedleTrial):
    lo, hi = trial.needle

    def needle_kept(cache) -> dict:
        kept = torch.stack([((layer.live()[2] >= lo) & (layer.live()[2] < hi)).float().sum(-1) / (hi - lo)
                            for layer in cache.layers]).mean().item()
        return {"needle_kept": kept, "cache_slots": cache.n_slots, "cache_bytes": cache.bytes_at(DEPLOYED_BYTES)}

    return needle_kept


def _store_held(model: CausalLM, trial: NeedleTrial):
    def store_held(cache) -> dict:
        return {"store_fraction": held_fraction(model, cache, trial.prompt.shape[1])}

    return store_held


def score_needle(model: CausalLM, trial: NeedleTrial, policy: Policy | None = None) -> dict:
    """Compress the prompt's cache with ``policy`` and score the answer. Returns exact (bool),
    logprob (sum over answer tokens), needle_kept (share of the needle's tokens still cached, mean
    over layers and KV heads), cache_slots and cache_bytes (at 16 bits), all three right after compression, and
    store_fraction (``course.frontier.held_fraction`` of the prompt's tokens once its last token is in the cache)."""
    return compare_needles(model, [trial], {0: lambda t: policy}, progress=False)[0]["trials"][0]


def continuation_nll(model: CausalLM, ids: Tensor, context: int, policy: Policy | None = None) -> Tensor:
    """NLL [B, N] of the last N = T - context tokens of ``ids`` [B, T] after compressing the first
    ``context`` tokens' cache with ``policy`` (the same protocol as the needle task)."""
    return compare_continuations(model, ids, context, {0: policy})[0]


def compare_continuations(model: CausalLM, ids: Tensor, context: int,
                          contenders: Mapping[Hashable, Policy | None]) -> dict[Hashable, Tensor]:
    """``continuation_nll`` for several (fresh) policies, from one shared prompt forward: name -> NLL [B, N]."""
    if not 1 < context < ids.shape[1]:
        raise ValueError(f"context must be between 2 and {ids.shape[1] - 1} (ids has {ids.shape[1]} tokens), got {context}")
    results = compare_after_compression(model, ids[:, :context], ids[:, context:], contenders)
    return {name: -logps for name, (logps, _, _) in results.items()}


def _check_trials(model: CausalLM, trials: list[NeedleTrial]) -> None:
    if not trials:
        raise ValueError("trials is empty: make some with make_needle_trials")
    longest = max(t.prompt.shape[1] + t.answer.shape[0] for t in trials)
    model.config.check_tokens(longest, "the longest passkey prompt + answer")


def _needle_summary(rows: list[dict]) -> dict:
    n = len(rows)
    return {
        "accuracy": sum(r["exact"] for r in rows) / n,
        "mean_answer_logprob": sum(r["logprob"] for r in rows) / n,
        "needle_kept": sum(r["needle_kept"] for r in rows) / n,
        "answer_prob": math.exp(sum(r["logprob"] for r in rows) / n),
        "trials": rows,
    }


def compare_needles(model: CausalLM, trials: list[NeedleTrial], contenders: Mapping[Hashable, Callable],
                    progress: bool = True) -> dict[Hashable, dict]:
    """Score every trial under every contender (``name -> policy_for(trial)``, a fresh policy each time:
    policies hold state); each trial's prompt runs once for all of them (``compare_after_compression``).

    Returns, per contender, accuracy, mean_answer_logprob, mean needle_kept, answer_prob and the
    per-trial rows (``score_needle``'s dicts)."""
    _check_trials(model, trials)
    if not contenders:
        raise ValueError("contenders is empty: give at least one name -> policy_for(trial)")
    rows: dict[Hashable, list[dict]] = {name: [] for name in contenders}
    for t in progress_bar(trials, desc="needle", enabled=progress):
        results = compare_after_compression(model, t.prompt, t.answer[None],
                                            {name: make(t) for name, make in contenders.items()}, _needle_kept(t),
                                            _store_held(model, t))
        for name, result in results.items():
            rows[name].append(_needle_scores(result))
    return {name: _needle_summary(r) for name, r in rows.items()}


def needle_eval(model: CausalLM, trials: list[NeedleTrial], policy_for: Callable, progress: bool = True) -> dict:
    """``compare_needles`` for one contender: accuracy, mean_answer_logprob, mean needle_kept, answer_prob, trials."""
    return compare_needles(model, trials, {0: policy_for}, progress)[0]


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
    results = compare_needles(model, trials, {b: (lambda t, b=b: make(b)) for b in budgets}, progress)
    return [{"policy": policy, "budget": b, "sinks": sinks, **{k: v for k, v in results[b].items() if k != "trials"}}
            for b in budgets]


def best_policy(rows: Sequence[Mapping], metric: str, max_tokens: int, higher_is_better: bool) -> str:
    """Read a strategy table: the ``policy`` of the row with the best ``metric`` among those whose ``tokens``
    (cache size) fit in ``max_tokens``; between equals, the smaller cache. ``ValueError`` when none fits."""
    fitting = sorted((r for r in rows if r["tokens"] <= max_tokens),
                     key=lambda r: (-r[metric] if higher_is_better else r[metric], r["tokens"]))
    if not fitting:
        raise ValueError(f"no policy fits in max_tokens={max_tokens} tokens")
    return fitting[0]["policy"]
