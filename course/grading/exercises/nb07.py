"""Notebook 07 (choosing a policy): references and checkers."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from course.evaluate import compress_prompt, continuation_nll
from course.grading.core import Wrong, exercise
from course.grading.exercises.fixtures import CallCounter, tiny_model
from course.policies import H2O, FullCache, SlidingWindow, SnapKV


# ----------------------------------------------------------------------------- 1. memory per policy
def cache_tokens(policy: str, budget: int, prompt: int, generated: int) -> int:
    """Tokens a policy holds per KV head after a ``prompt`` and ``generated`` new tokens.

    full keeps everything; window, streaming and h2o never exceed their budget; snapkv compresses
    the prompt to its budget once and then keeps every generated token.
    """
    if policy == "full":
        return prompt + generated
    if policy in ("window", "streaming", "h2o"):
        return min(prompt + generated, budget)
    if policy == "snapkv":
        return min(prompt, budget) + generated
    raise ValueError(f"policy must be full, window, streaming, h2o or snapkv; got {policy!r}")


@exercise("07.cache_tokens", "Exercise 1 (what each policy keeps)", cache_tokens)
def _check_cache_tokens(fn) -> None:
    cases = [("full", 100, 1000, 50), ("window", 100, 1000, 50), ("streaming", 100, 60, 20), ("h2o", 128, 1000, 500),
             ("snapkv", 100, 1000, 50), ("snapkv", 100, 60, 10)]
    for case in cases:
        got, want = fn(*case), cache_tokens(*case)
        if got == want:
            continue
        policy, budget, prompt, generated = case
        if policy == "snapkv" and got == min(prompt + generated, budget):
            raise Wrong("SnapKV compresses the prompt once; it does not evict while generating, so its cache grows")
        if policy in ("window", "streaming", "h2o") and got == budget and prompt + generated < budget:
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
        {"policy": "window", "tokens": 100, "ppl": 300.0, "accuracy": 0.0},
    ]
    cases = [("ppl", 100, False), ("accuracy", 150, True), ("accuracy", 100, True), ("ppl", 2000, False)]
    for metric, cap, hib in cases:
        got, want = fn(rows, metric, cap, hib), choose_policy(rows, metric, cap, hib)
        if got == want:
            continue
        chosen = next((r for r in rows if r["policy"] == got), None)
        if chosen is not None and chosen["tokens"] > cap:
            raise Wrong(f"{got} needs {chosen['tokens']} tokens, more than the {cap} allowed")
        if got == choose_policy(rows, metric, cap, not hib):
            raise Wrong("higher_is_better says which way the metric goes: perplexity lower, accuracy higher")
        raise Wrong(f"metric={metric}, max_tokens={cap}: expected {want}, got {got!r}")
