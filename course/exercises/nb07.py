"""Notebook 07 (choosing a policy): references and checkers."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from course.evaluate import compress_prompt, continuation_nll
from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import CallCounter, tiny_model
from course.policies import H2O, FullCache, SlidingWindow, SnapKV


# ----------------------------------------------------------------------------- 1. memory per policy
def cache_tokens(policy: str, budget: int, prompt: int, generated: int) -> int:
    """Tokens a policy holds per KV head after a ``prompt`` and ``generated`` new tokens.

    full keeps everything; window, streaming, h2o and h2o-mean never exceed their budget; snapkv compresses
    the prompt to its budget once and then keeps every generated token.
    """
    if policy == "full":
        return prompt + generated
    if policy in ("window", "streaming", "h2o", "h2o-mean"):
        return min(prompt + generated, budget)
    if policy == "snapkv":
        return min(prompt, budget) + generated
    raise ValueError(f"policy must be full, window, streaming, h2o, h2o-mean or snapkv; got {policy!r}")


@exercise("07.cache_tokens", "Exercise 1 (what each policy keeps)", cache_tokens)
def _check_cache_tokens(fn) -> None:
    cases = [("full", 100, 1000, 50), ("window", 100, 1000, 50), ("streaming", 100, 60, 20), ("h2o", 128, 1000, 500),
             ("h2o-mean", 128, 100, 10), ("snapkv", 100, 1000, 50), ("snapkv", 100, 60, 10)]
    for case in cases:
        got, want = fn(*case), cache_tokens(*case)
        if got == want:
            continue
        policy, budget, prompt, generated = case
        if policy == "snapkv" and got == min(prompt + generated, budget):
            raise Wrong("SnapKV compresses the prompt once; it does not evict while generating, so its cache grows")
        if policy in ("window", "streaming", "h2o", "h2o-mean") and got == budget and prompt + generated < budget:
            raise Wrong("a cache cannot hold more tokens than it has seen: min(prompt + generated, budget)")
        if policy == "full" and got == prompt:
            raise Wrong("the full cache keeps the generated tokens too")
        raise Wrong(f"cache_tokens{case} should be {want}, got {got!r}")


# ----------------------------------------------------------------------------- 2. the protocol
def compressed_perplexity(model, ids: Tensor, context: int, policy) -> float:
    """Perplexity of ids[:, context:] after compressing the cache of ids[:, :context] with ``policy``.

    Compress the cache of ids[:, :context - 1] (``compress_prompt``: full attention, then the policy's budget),
    then feed ids[:, context - 1], ids[:, context], ... one token at a time, scoring each next token.
    """
    cache, _ = compress_prompt(model, ids[:, : context - 1], policy)
    with torch.inference_mode():
        nll = []
        for t in range(context - 1, ids.shape[1] - 1):
            logits = model(ids[:, t : t + 1], cache=cache).logits[:, -1]
            nll.append(torch.nn.functional.cross_entropy(logits.float(), ids[:, t + 1], reduction="none"))
    return math.exp(torch.stack(nll).double().mean().item())


@exercise("07.compressed_perplexity", "Exercise 2 (perplexity through a compressed cache)", compressed_perplexity)
def _check_protocol(fn) -> None:
    model = tiny_model("llama", seed=4)
    ids = torch.randint(0, 53, (2, 40), generator=torch.Generator().manual_seed(0))
    for make in (lambda: SnapKV(10, obs_window=3), lambda: H2O(4, 4), lambda: SlidingWindow(8)):
        want = math.exp(continuation_nll(model, ids, 24, make()).double().mean().item())
        counter = CallCounter(model)
        got = fn(counter, ids, 24, make())
        if isinstance(got, Tensor):
            got = float(got)
        if abs(got - want) <= 1e-6 * want:
            continue
        full = math.exp(continuation_nll(model, ids, 24, FullCache()).double().mean().item())
        if abs(got - full) <= 1e-6 * full:
            raise Wrong("that is the full-cache perplexity: compress the context's cache (compress_prompt), and score "
                        "the continuation through that cache")
        if any(n > 1 for n in counter.calls[1:]):
            raise Wrong("after compressing, feed one token at a time: several tokens at once attend with full "
                        "attention to each other and the policy does not evict between them")
        if counter.calls and counter.calls[0] == 24:
            raise Wrong("run the context *but its last token* before compressing, then feed ids[:, context - 1]: "
                        "otherwise the first prediction comes from the uncompressed cache")
        raise Wrong(f"expected perplexity {want:.4f}, got {got!r}")


# ----------------------------------------------------------------------------- 3. reading the table
def choose_policy(rows: list[dict], metric: str, max_tokens: int, higher_is_better: bool) -> str:
    """The policy with the best ``metric`` among rows whose ``tokens`` (cache size) fit ``max_tokens``.

    rows: [{"policy": name, "tokens": int, metric: float, ...}, ...]. Ties go to the smaller cache.
    """
    fitting = [r for r in rows if r["tokens"] <= max_tokens]
    if not fitting:
        raise ValueError(f"no policy fits in {max_tokens} tokens")
    sign = -1 if higher_is_better else 1
    return min(fitting, key=lambda r: (sign * r[metric], r["tokens"]))["policy"]


@exercise("07.choose_policy", "Exercise 3 (reading the strategy table)", choose_policy)
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
        got, want = fn(rows, metric, cap, hib), choose_policy(rows, metric, cap, hib)
        if got == want:
            continue
        chosen = next((r for r in rows if r["policy"] == got), None)
        if chosen is not None and chosen["tokens"] > cap:
            raise Wrong(f"{got} needs {chosen['tokens']} tokens, more than the {cap} allowed")
        if chosen is not None and chosen[metric] == next(r for r in rows if r["policy"] == want)[metric]:
            raise Wrong(f"{got} and {want} tie on {metric}: ties go to the smaller cache")
        if got == choose_policy(rows, metric, cap, not hib):
            raise Wrong("higher_is_better says which way the metric goes: perplexity lower, accuracy higher")
        raise Wrong(f"metric={metric}, max_tokens={cap}: expected {want}, got {got!r}")


# ----------------------------------------------------------------------------- 4. capstone: a policy of your own
def my_scores(positions: Tensor, attention: Tensor, seen: int, budget: int) -> Tensor:
    """Keep-scores of a hybrid policy: pinned sinks, the recent third of the budget, then heavy hitters by mean
    attention, smoothed along the stream so that the neighbours of a heavy hitter stay with it (spans).

    positions, attention: [H_kv, S] (what the cache knows about each slot); returns [H_kv, S].
    """
    n_sink = min(4, max(1, budget // 6))  # the first tokens: the sink
    recent = max(1, budget // 3)  # the newest tokens: local context
    age = (seen - positions).clamp(min=1).float()  # how many queries could see each key
    mean_attention = attention.float() / age  # per query: old keys are not favoured
    order = positions.argsort(dim=-1)  # slots in stream order (after evictions they are not)
    in_order = mean_attention.gather(-1, order)[:, None]  # [H_kv, 1, S]
    pooled = torch.nn.functional.max_pool1d(in_order, 3, stride=1, padding=1)[:, 0]
    spans = 0.5 * in_order[:, 0] + 0.5 * pooled  # a heavy hitter lifts its neighbours, but less than itself
    heavy = torch.empty_like(spans).scatter_(-1, order, spans)  # back to slot order
    tie_break = positions.float() / max(seen, 1) * 1e-6  # equal scores: keep the newer
    scores = heavy + tie_break
    scores = torch.where(positions >= seen - recent, 1e9 + positions.float(), scores)  # recent: always kept
    return scores.masked_fill(positions < n_sink, math.inf)  # sinks: never evicted


def _slots(h: int, s: int, seen: int, seed: int) -> tuple[Tensor, Tensor]:
    """A cache after evictions: [h, s] distinct positions below ``seen`` in scrambled slot order, and attention."""
    g = torch.Generator().manual_seed(seed)
    kept = torch.stack([torch.cat([torch.arange(4), 4 + torch.randperm(seen - 4, generator=g)[: s - 4]])
                        for _ in range(h)])
    order = torch.stack([torch.randperm(s, generator=g) for _ in range(h)])
    return kept.gather(1, order), torch.rand(h, s, generator=g) * 3


def _on_held_out(fn) -> str:
    """The autograder's measurement (``course.instructor.grading.capstone``): perplexity on held-out passages
    against StreamingLLM and the plain window at the same budget."""
    from course.instructor.grading.capstone import judge

    return judge(fn)


@exercise("07.my_policy", "Exercise 4 (a policy of your own, graded on held-out passages)", my_scores, points=2,
          graded=_on_held_out)
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
    recent = recent[torch.randperm(budget, generator=torch.Generator().manual_seed(7))].expand(2, budget)
    streaming_like = torch.as_tensor(fn(recent.clone(), attention.clone(), seen, budget)).double()
    pinned = max(int(torch.isinf(x).logical_and(x > 0).sum(-1).max()) for x in (got, streaming_like))
    if pinned >= budget:
        raise Wrong(f"budget: {pinned} slots of a head score inf (never evict) but the budget is {budget} slots, and "
                    "a new token needs one: the cache would have to evict a slot you pinned. Pin fewer (sinks only)")
    again = torch.as_tensor(fn(positions.clone(), attention.clone(), seen, budget)).double()
    if not torch.equal(again.nan_to_num(posinf=1e300), got.nan_to_num(posinf=1e300)):
        raise Wrong("the same cache gave different scores: decide from the arguments only (no random numbers "
                    "without a fixed seed, no state kept between calls, nothing from outside the cache)")
    perm = torch.randperm(budget, generator=torch.Generator().manual_seed(6))
    moved = torch.as_tensor(fn(positions[:, perm].clone(), attention[:, perm].clone(), seen, budget)).double()
    if not torch.allclose(moved.nan_to_num(posinf=1e300), got[:, perm].nan_to_num(posinf=1e300)):
        raise Wrong("your scores depend on where a token sits in the cache (its slot index), not on what the cache "
                    "tells you about it: after evictions slots are not in stream order, use `positions`")
    _check_policy_in_protocol(fn)


def _check_policy_in_protocol(fn) -> None:
    """The student's scores as a policy in the real cache: the budget holds at every step, the run is finite."""
    from course.function_policy import score_policy

    model = tiny_model("llama", seed=4)
    ids = torch.randint(0, 53, (2, 36), generator=torch.Generator().manual_seed(1))
    budget = 10
    cache, _ = compress_prompt(model, ids[:, :23], score_policy(fn, budget))
    sizes = [cache.layers[0].length]
    with torch.inference_mode():
        nll = []
        for t in range(23, ids.shape[1] - 1):
            logits = model(ids[:, t : t + 1], cache=cache).logits[:, -1]
            nll.append(torch.nn.functional.cross_entropy(logits.float(), ids[:, t + 1], reduction="none"))
            sizes.append(max(layer.length for layer in cache.layers))
    if max(sizes) > budget:
        raise Wrong(f"the cache grew to {max(sizes)} slots with a budget of {budget}")
    if not bool(torch.isfinite(torch.stack(nll)).all()):
        raise Wrong("decoding through your policy gave a non-finite loss: check for inf or NaN in your scores")


def conclusion() -> str:
    """The written conclusion of the capstone (checked for presence and length only)."""
    return ("My hybrid pins four sinks, keeps the most recent quarter of the budget and fills the rest with the "
            "tokens that received the most attention per query that could see them. I compared it with the window, "
            "StreamingLLM and H2O at the same budget, with the same protocol (compress the context, then decode one "
            "token at a time). Where it wins or loses depends on the budget and on the model: the table above is "
            "the evidence, and one run on a few passages is not enough to call a winner.")


MIN_WORDS = 30


@exercise("07.conclusion", "Exercise 5 (your conclusion)", conclusion)
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
