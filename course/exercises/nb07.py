"""Notebook 07 (choosing a policy): checkers, each against the course's own mechanisms.

The capstone (``07.my_policy``) is checked here for what a notebook can check (a well-formed policy that keeps its
budget in the real cache); what it achieves is measured by the autograder on passages the student never sees
(``course.instructor.grading.capstone``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from course.evaluate import (best_policy, compare_after_compression, compare_continuations, continuation_nll,
                             decode_after_compression)
from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import generator, tiny_model
from course.exercises.guards import GuardedModel
from course.exercises.nb03 import streaming_scores_with_course
from course.function_policy import score_policy
from course.policies import H2O, FullCache, SlidingWindow, SnapKV, make_policy


# ----------------------------------------------------------------------------- 1. memory per policy
def _tokens_by_policy(policy: str, budget: int, prompt: int, generated: int) -> int:
    """AUTOFILL's memory per policy: the slots the course's policy keeps, from its two budgets (the prompt's,
    then decoding's)."""
    p = make_policy(policy, budget)
    kept = prompt if p.prompt_budget is None else min(prompt, p.prompt_budget)
    return kept + generated if p.budget is None else min(kept + generated, p.budget)


@exercise("07.cache_tokens", "Exercise 1 (what each policy keeps)", fallback=_tokens_by_policy,
          shortcuts=(make_policy,))
def _check_cache_tokens(fn) -> None:
    cases = [("full", 100, 1000, 50), ("window", 100, 1000, 50), ("streaming", 100, 60, 20), ("h2o", 128, 1000, 500),
             ("h2o-mean", 128, 100, 10), ("snapkv", 100, 1000, 50), ("snapkv", 100, 60, 10)]
    for case in cases:
        got, want = fn(*case), _tokens_by_policy(*case)
        if got == want:
            continue
        policy, budget, prompt, generated = case
        said = f"cache_tokens{case} should be {want}, got {got!r}"
        if policy == "snapkv" and got == min(prompt + generated, budget):
            raise Wrong(f"{said}: SnapKV compresses the prompt once; it does not evict while generating, so its "
                        "cache grows by every generated token")
        if policy in ("window", "streaming", "h2o", "h2o-mean") and got == budget and prompt + generated < budget:
            raise Wrong(f"{said}: a cache cannot hold more tokens than it has seen: min(prompt + generated, budget)")
        if policy == "full" and got == prompt:
            raise Wrong(f"{said}: the full cache keeps the generated tokens too")
        raise Wrong(f"{said}: the slots one KV head holds once the prompt is in and the tokens are generated (the "
                    "table above: what each policy keeps, and whether it evicts while decoding)")


# ----------------------------------------------------------------------------- 2. the protocol
def _perplexity_with_course(model, ids: Tensor, context: int, policy) -> float:
    """AUTOFILL's protocol: the course's ``continuation_nll``, as a perplexity."""
    return math.exp(continuation_nll(model, ids, context, policy).double().mean().item())


@exercise("07.compressed_perplexity", "Exercise 2 (perplexity through a compressed cache)",
          fallback=_perplexity_with_course,
          shortcuts=(continuation_nll, compare_continuations, decode_after_compression, compare_after_compression))
def _check_protocol(fn) -> None:
    model = tiny_model("llama", seed=4)
    ids = torch.randint(0, 53, (2, 40), generator=generator(0))
    for make in (lambda: SnapKV(10, obs_window=3), lambda: H2O(4, 4), lambda: SlidingWindow(8)):
        want = _perplexity_with_course(model, ids, 24, make())
        with GuardedModel(model, policies=True) as guarded:
            got = fn(guarded, ids, 24, make())
        case = f"{make().label}, ids [2, 40] (a tiny float64 Llama), context 24"
        try:
            got = float(got)  # a float, or anything holding one number (a 0-d tensor, a NumPy scalar)
        except (TypeError, ValueError, RuntimeError):
            raise Wrong(f"{case}: return the perplexity as one number (a float), got {type(got).__name__}") from None
        if abs(got - want) <= 1e-6 * want:
            continue
        said = f"{case}: expected perplexity {want:.4f}, got {got:.4f}"
        full = _perplexity_with_course(model, ids, 24, FullCache())
        if abs(got - full) <= 1e-6 * full:
            raise Wrong(f"{said}, the full-cache perplexity: compress the context's cache (compress_prompt), and score "
                        "the continuation through that cache")
        if any(n > 1 for n in guarded.calls[1:]):
            raise Wrong(f"{said}: after compressing, feed one token at a time: several tokens at once attend with full "
                        "attention to each other and the policy does not evict between them")
        if guarded.calls and guarded.calls[0] == 24:
            raise Wrong(f"{said}: run the context *but its last token* before compressing, then feed "
                        "ids[:, context - 1]: otherwise the first prediction comes from the uncompressed cache")
        per_row = continuation_nll(model, ids, 24, make()).double().mean(dim=1).exp()
        if abs(got - float(per_row.mean())) <= 1e-6 * want:
            raise Wrong(f"{said}, the mean of the rows' perplexities: the perplexity is exp of the mean NLL over every "
                        "scored token of every row")
        raise Wrong(f"{said}: exp of the mean NLL of ids[:, context:], every row, each token predicted through the "
                    "compressed cache")


# ----------------------------------------------------------------------------- 3. reading the table
@exercise("07.choose_policy", "Exercise 3 (reading the strategy table)", fallback=best_policy,
          shortcuts=(best_policy,))
def _check_choose(fn) -> None:
    rows = [
        {"policy": "full", "tokens": 1000, "ppl": 17.0, "accuracy": 1.0},
        {"policy": "streaming", "tokens": 100, "ppl": 19.0, "accuracy": 0.0},
        {"policy": "h2o", "tokens": 100, "ppl": 18.0, "accuracy": 0.3},
        {"policy": "snapkv", "tokens": 120, "ppl": 18.5, "accuracy": 0.8},
        {"policy": "hybrid", "tokens": 110, "ppl": 18.5, "accuracy": 0.8},  # ties snapkv with a smaller cache
        {"policy": "window", "tokens": 100, "ppl": 300.0, "accuracy": 0.0},
    ]
    cases = [("ppl", 100, False), ("accuracy", 150, True), ("accuracy", 100, True), ("ppl", 2000, False),
             ("accuracy", 115, True)]
    for metric, cap, hib in cases:
        got, want = fn([dict(r) for r in rows], metric, cap, hib), best_policy(rows, metric, cap, hib)  # a copy
        if got == want:
            continue
        said = f"metric={metric!r}, max_tokens={cap}, higher_is_better={hib}: expected {want!r}, got {got!r}"
        chosen = next((r for r in rows if r["policy"] == got), None)
        if chosen is not None and chosen["tokens"] > cap:
            raise Wrong(f"{said}: {got} needs {chosen['tokens']} tokens, more than the {cap} allowed")
        if chosen is not None and chosen[metric] == next(r for r in rows if r["policy"] == want)[metric]:
            raise Wrong(f"{said}: {got} and {want} tie on {metric}: ties go to the smaller cache")
        if got == best_policy(rows, metric, cap, not hib):
            raise Wrong(f"{said}: higher_is_better says which way the metric goes: perplexity lower, accuracy higher")
        if chosen is None:
            raise Wrong(f"{said}: return the row's \"policy\" string (one of {[r['policy'] for r in rows]})")
        raise Wrong(f"{said}: the best {metric} among the rows whose tokens <= max_tokens")


# ----------------------------------------------------------------------------- 4. capstone: a policy of your own
def _streaming_keep_scores(positions: Tensor, attention: Tensor, seen: int, budget: int) -> Tensor:
    """AUTOFILL's capstone: StreamingLLM's keep-scores (up to four sinks and the most recent tokens)."""
    return streaming_scores_with_course(positions, seen, min(4, budget - 1))


def _slots(h: int, s: int, seen: int, seed: int) -> tuple[Tensor, Tensor]:
    """A cache after evictions: [h, s] distinct positions below ``seen`` in scrambled slot order, and attention."""
    g = generator(seed)
    kept = torch.stack([torch.cat([torch.arange(4), 4 + torch.randperm(seen - 4, generator=g)[: s - 4]])
                        for _ in range(h)])
    order = torch.stack([torch.randperm(s, generator=g) for _ in range(h)])
    return kept.gather(1, order), torch.rand(h, s, generator=g) * 3


@exercise("07.my_policy", "Exercise 4 (a policy of your own, graded on held-out passages)", points=8,
          kind="capstone", fallback=_streaming_keep_scores)
def _check_my_policy(fn) -> None:
    budget, seen = 12, 40
    positions, attention = _slots(2, budget, seen, seed=5)
    got = fn(positions.clone(), attention.clone(), seen, budget)
    if not isinstance(got, Tensor) or tuple(got.shape) != tuple(positions.shape):
        shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
        raise Wrong(f"return one score per cached slot, a tensor of shape {tuple(positions.shape)} "
                    f"[kv_heads, slots]; got {shape}")
    got = got.double()
    if bool(got.isnan().any()):
        raise Wrong("a NaN score cannot be compared: the cache would evict an arbitrary slot (0 / 0 somewhere?)")
    recent = torch.cat([torch.arange(4), torch.arange(seen - budget + 4, seen)])  # sinks + the newest tokens
    recent = recent[torch.randperm(budget, generator=generator(7))].expand(2, budget)
    streaming_like = torch.as_tensor(fn(recent.clone(), attention.clone(), seen, budget)).double()
    pinned = max(int(torch.isinf(x).logical_and(x > 0).sum(-1).max()) for x in (got, streaming_like))
    if pinned >= budget:
        raise Wrong(f"budget: {pinned} slots of a head score inf (never evict) but the budget is {budget} slots, and "
                    "a new token needs one: the cache would have to evict a slot you pinned. Pin fewer (sinks only)")
    again = torch.as_tensor(fn(positions.clone(), attention.clone(), seen, budget)).double()
    if not torch.equal(again.nan_to_num(posinf=1e300), got.nan_to_num(posinf=1e300)):
        raise Wrong("the same cache gave different scores: decide from the arguments only (no random numbers "
                    "without a fixed seed, no state kept between calls, nothing from outside the cache)")
    perm = torch.randperm(budget, generator=generator(6))
    moved = torch.as_tensor(fn(positions[:, perm].clone(), attention[:, perm].clone(), seen, budget)).double()
    if not torch.allclose(moved.nan_to_num(posinf=1e300), got[:, perm].nan_to_num(posinf=1e300)):
        raise Wrong("your scores depend on where a token sits in the cache (its slot index), not on what the cache "
                    "tells you about it: after evictions slots are not in stream order, use `positions`")
    _check_policy_in_protocol(fn)


def _check_policy_in_protocol(fn) -> None:
    """The student's scores as a policy in the real cache, through notebook 07's protocol: a finite loss."""
    model = tiny_model("llama", seed=4)
    ids = torch.randint(0, 53, (2, 36), generator=generator(1))
    with torch.inference_mode():
        nll = continuation_nll(model, ids, 24, score_policy(fn, 10))
    if not bool(torch.isfinite(nll).all()):
        raise Wrong("decoding through your policy gave a non-finite loss: check for inf or NaN in your scores")


MIN_WORDS = 30


def _no_conclusion_yet() -> str:
    """AUTOFILL's stand-in for the conclusion: says that none is written (and would not pass the check)."""
    return "(AUTOFILL: no conclusion written yet)"


@exercise("07.conclusion", "Exercise 5 (your conclusion)", kind="writing", fallback=_no_conclusion_yet)
def _check_conclusion(fn) -> None:
    text = fn()
    if not isinstance(text, str):
        raise Wrong(f"return your conclusion as a string, got {type(text).__name__}")
    words = text.split()
    if not words or "YOUR ANSWER HERE" in text.upper():
        raise Wrong("write your conclusion: what your policy does, how it compared with the others at the same "
                    "budget, and what you would try next")
    if len(words) < MIN_WORDS:
        raise Wrong(f"{len(words)} words is too short for a conclusion: write at least {MIN_WORDS} (what your policy "
                    "does, how it compared with the others at the same budget, and why)")
