"""Notebook 03 (StreamingLLM): checkers, each against the course's own mechanisms."""

from __future__ import annotations

import torch
from torch import Tensor

from course.builds import drive_layers
from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close, first_difference, generator, policy_trace, tiny_model, token_ids
from course.exercises.hints import hint
from course.function_policy import streaming_policy
from course.kvcache import KVCache, LayerCache
from course.models.attend import attend
from course.models.llama import rope
from course.policies import PinSinks, Policy, SlidingWindow, StreamingLLM, make_policy
from course.streaming import decode_stream

_STREAMING = (make_policy, StreamingLLM, PinSinks, SlidingWindow)


# ----------------------------------------------------------------------------- 1. positions in the cache
def _ranks_with_course(original: Tensor) -> Tensor:
    """AUTOFILL's re-assignment: the course's ``Policy.cache_ranks`` of one KV head's positions."""
    return Policy().cache_ranks(original[None, None])[0, 0]


@exercise("03.cache_positions", "Exercise 1 (positions inside the cache)", fallback=_ranks_with_course,
          shortcuts=(Policy.cache_ranks,))
def _check_cache_positions(fn) -> None:
    cases = [torch.tensor([0, 1, 2, 3, 20, 21, 14, 15, 16, 17, 18, 19]),  # sinks + ring buffer
             torch.tensor([0, 1, 2, 3, 4, 5]), torch.tensor([0, 9, 7, 8])]
    for original in cases:
        got = fn(original.clone())
        want = _ranks_with_course(original)
        if close(got, want):
            continue
        if close(got, original):
            raise Wrong("these are the original positions: StreamingLLM gives the cached tokens positions 0..n-1")
        if close(got, torch.arange(len(original))):
            raise Wrong("slot order is not token order (the recent part is a ring buffer): rank the slots by their "
                        "original position")
        if close(got, original.argsort()):
            raise Wrong("argsort gives, for each rank, the slot that has it; you need the inverse: for each slot, "
                        "its rank (argsort twice)")
        raise Wrong(f"for original positions {original.tolist()} expected {want.tolist()}")
    _check_ranks_in_the_cache(fn)


def _check_ranks_in_the_cache(fn) -> None:
    """The re-assignment plugged into the real cache: a StreamingLLM stream on a tiny RoPE model."""
    model, ids = tiny_model("llama"), token_ids(30, seed=1)
    want = policy_trace(model, ids, make_policy("streaming", 8, sinks=2, model=model))
    try:
        got = policy_trace(model, ids, streaming_policy(streaming_scores_with_course, 8, 2, model=model, ranks=fn))
    except ValueError as e:
        raise Wrong(f"in the cache: {e}") from None
    if not close(got[1], want[1], 1e-9):
        raise Wrong("plugged into a StreamingLLM cache (2 sinks + 6 recent slots) your positions give another NLL "
                    "than the course's: every slot must get the rank of its original position among the cached ones")


# ----------------------------------------------------------------------------- 2. re-rotating cached keys
@exercise("03.rerotate", "Exercise 2 (re-rotating cached keys)")
def _check_rerotate(fn) -> None:
    g = generator(0)
    cases = [(torch.tensor([0, 1, 50, 51, 52, 53]), torch.tensor([0, 1, 2, 3, 4, 5]), 1, 10000.0),
             (torch.tensor([0, 1, 2, 3, 907, 904, 905, 906]), torch.tensor([0, 1, 2, 3, 7, 4, 5, 6]), 3, 100000.0)]
    for old, new, heads, theta in cases:
        k = torch.randn(heads, len(old), 8, generator=g, dtype=torch.float64)  # [heads, N, d], never rotated
        k_old = rope(k[None], old[None], theta)[0]
        want = rope(k[None], new[None], theta)[0]  # what the key would be, rotated at its new position directly
        got = fn(k_old, old, new, theta)
        if close(got, want, 1e-6):
            continue
        if close(got, rope(k_old[None], new[None], theta)[0], 1e-6):
            raise Wrong("the keys are already rotated by their old positions: rotate by the *difference* new - old")
        if close(got, rope(k_old[None], (old - new)[None], theta)[0], 1e-6):
            raise Wrong("wrong direction: rotate by new - old, not old - new")
        if close(got, rope(k_old[None], (new - old)[None], 10000.0)[0], 1e-6):
            raise Wrong(f"use the theta you are given ({theta:g}): models differ (SmolLM2 uses 100000)")
        raise Wrong("RoPE rotations compose: rotating by a then by b is rotating by a + b; "
                    "use course.models.llama.rope")


# ----------------------------------------------------------------------------- 3. the ring buffer
def _slots_in_course_cache(n_tokens: int, n_sink: int, window: int) -> list[int]:
    """The slot where the course's StreamingLLM cache writes each of the first ``n_tokens`` tokens."""
    cache = KVCache(1, 1, 1, 1, policy=StreamingLLM(n_sink, window))
    slots = []
    for t in range(n_tokens):
        cache.update(0, torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1), torch.tensor([[t]]))
        cache.advance(1)
        slots.append(int((cache.positions(0)[0, 0] == t).nonzero()[0]))
    return slots


def _slot_with_course(t: int, n_sink: int, window: int) -> int:
    """AUTOFILL's ring buffer: where the course's cache writes token t."""
    return _slots_in_course_cache(t + 1, n_sink, window)[t]


@exercise("03.rolling_slot", "Exercise 3 (a ring buffer that never moves the sinks)", fallback=_slot_with_course,
          shortcuts=(KVCache, LayerCache))
def _check_rolling_slot(fn) -> None:
    for n_sink, window in ((4, 6), (1, 3), (0, 5), (2, 2)):
        got = [fn(t, n_sink, window) for t in range(40)]
        want = _slots_in_course_cache(40, n_sink, window)
        if got == want:
            continue
        if n_sink and any(s < n_sink for s in got[n_sink:]):
            raise Wrong(f"a sink slot was overwritten (n_sink={n_sink}): recent tokens cycle through slots "
                        f"{n_sink}..{n_sink + window - 1} only")
        if any(s >= n_sink + window or s < 0 for s in got):
            raise Wrong(f"slots run from 0 to n_sink + window - 1 = {n_sink + window - 1}")
        first = next(t for t in range(40) if got[t] != want[t])
        raise Wrong(f"token {first} should go to slot {want[first]} (n_sink={n_sink}, window={window}), "
                    f"got {got[first]}: each new token must overwrite the *oldest* recent one")


# ----------------------------------------------------------------------------- 4. StreamingLLM as a policy
def streaming_scores_with_course(positions: Tensor, seen: int, n_sink: int) -> Tensor:
    """AUTOFILL's keep-priority: the course's StreamingLLM scores of a cache holding ``positions`` [H_kv, S]."""
    h, s = positions.shape
    layer = LayerCache(torch.zeros(1, h, s, 1), torch.zeros(1, h, s, 1), positions[None].clone(), length=s)
    return StreamingLLM(n_sink, max(s - n_sink, 1)).scores(layer, seen)[0]


def _sorted_lists(kept: Tensor) -> list[int]:
    return kept[0, 0].tolist()


@exercise("03.streaming_scores", "Exercise 4 (StreamingLLM as a policy in the real cache)", points=2,
          fallback=streaming_scores_with_course, shortcuts=_STREAMING)
def _check_streaming_scores(fn) -> None:
    model, ids = tiny_model("llama"), token_ids(40, seed=2)
    for n_sink, budget in ((4, 10), (1, 7), (0, 6)):
        want_kept, want_nll = policy_trace(model, ids, make_policy("streaming", budget, sinks=n_sink, model=model))
        try:
            got_kept, got_nll = policy_trace(model, ids, streaming_policy(fn, budget, n_sink, model=model))
        except ValueError as e:
            raise Wrong(str(e)) from None
        step = first_difference(got_kept, want_kept)
        if step is None and close(got_nll, want_nll, 1e-9):
            continue
        if step is None:
            raise Wrong("the cache kept the right tokens but the NLL differs: return one score per slot, in slot order")
        got, want = set(_sorted_lists(got_kept[step])), set(_sorted_lists(want_kept[step]))
        lost, extra = sorted(want - got), sorted(got - want)
        if any(p < n_sink for p in lost):
            raise Wrong(f"you evicted a pinned sink (position {min(lost)}, n_sink={n_sink}) after token {step}: the "
                        "first n_sink positions must score inf")
        if lost and max(lost) == step - 1 or step in lost:
            raise Wrong("you evicted the newest token: the cache overwrites the slot with the *lowest* score, so the "
                        "oldest non-sink token must score lowest")
        if extra == [n_sink]:
            raise Wrong(f"position {n_sink} is never evicted (off by one): pin exactly the first n_sink tokens, "
                        f"positions 0 .. {n_sink - 1}")
        raise Wrong(f"with {n_sink} sinks and {budget} slots, after token {step} the cache should hold positions "
                    f"{sorted(want)}, yours holds {sorted(got)}")


# ----------------------------------------------------------------------------- 5. build: the rolling cache
def _rolling_step_with_course(state, q: Tensor, k: Tensor, v: Tensor, t: int, n_sink: int, window: int,
                              theta: float):
    """AUTOFILL's build: one layer of the course's StreamingLLM cache (the state is a one-layer ``KVCache``)."""
    b, hkv, _, d = k.shape
    if state is None:
        state = KVCache(1, b, hkv, d, policy=StreamingLLM(n_sink, window), dtype=k.dtype, device=k.device)
    view = state.update(0, k, v, torch.full((b, 1), t, device=k.device))
    state.advance(1)
    out, _ = attend(rope(q, view.q_rope, theta), rope(view.keys, view.k_rope, theta), view.values)
    return out, state


def _nll(logits: Tensor, ids: Tensor) -> Tensor:
    """NLL [B, T - 1] of each next token under logits [B, T, vocab]."""
    logits = logits.double()[:, :-1]
    return torch.logsumexp(logits, -1) - logits.gather(-1, ids[:, 1:, None])[..., 0]


def _diagnose_rolling(model, ids: Tensor, n_sink: int, window: int, got_nll: Tensor, step: int) -> str:
    """The mistake, as the course's cache rule that gives the same NLL, or the stage where it first differs."""
    size = n_sink + window
    rules = [(make_policy("streaming", size, sinks=n_sink, positions="original", model=model),
              "these are the original positions: StreamingLLM rotates every cached key by its rank among the cached "
              "positions (0 .. n-1) and the query by n - 1, so that no distance exceeds the cache")]
    if n_sink:
        rules.append((make_policy("streaming", size, sinks=0, model=model),
                      "a sink slot was overwritten: once the cache is full, token t goes to slot "
                      "n_sink + (t - n_sink) % window, never below n_sink"))
    for policy, text in rules:
        if close(got_nll, decode_stream(model, ids, policy, progress=False).nll.double(), 1e-6):
            return hint(3, text)
    if step < size - 1:
        return hint(1, f"{n_sink} sinks + {window} recent slots: your predictions differ from token {step} on, before "
                       f"the cache is full (token {size - 1}): the attention itself (rotation by rank, GQA, the "
                       "1/sqrt(d) scale) is not the course's")
    return hint(3, f"{n_sink} sinks + {window} recent slots: your predictions differ from the course's StreamingLLM "
                   f"cache from token {step} on, once the cache has filled (token {size - 1}): which slot the new "
                   "token overwrites, the ranks of the cached keys (slot order is not token order), the query's rank")


@exercise("03.rolling_step", "Build exercise (the rolling cache, re-assigned and re-rotated)", points=6,
          kind="build", fallback=_rolling_step_with_course,
          shortcuts=(*_STREAMING, KVCache, LayerCache, attend, decode_stream))
def _check_rolling_step(fn) -> None:
    model, ids = tiny_model("llama", seed=5), token_ids(22, seed=5).expand(2, -1).clone()
    ids[1] = token_ids(22, seed=6)[0]
    for n_sink, window in ((2, 6), (1, 4), (0, 5)):
        policy = make_policy("streaming", n_sink + window, sinks=n_sink, model=model)  # the cache rule
        want_nll = decode_stream(model, ids, policy, progress=False).nll.double()  # the course's cache, the oracle
        try:
            got_nll = _nll(drive_layers(model, ids, fn, n_sink, window), ids)
        except ValueError as e:
            raise Wrong(hint(2, str(e))) from None
        if close(got_nll, want_nll, 1e-6):
            continue
        step = int(((got_nll - want_nll).abs() > 1e-6).any(0).nonzero()[0])
        raise Wrong(_diagnose_rolling(model, ids, n_sink, window, got_nll, step))
