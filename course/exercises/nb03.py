"""Notebook 03 (StreamingLLM): references and checkers."""

from __future__ import annotations

import torch
from torch import Tensor

from course.function_policy import streaming_policy
from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close, first_difference, policy_trace, tiny_model, token_ids
from course.models.llama import rope
from course.policies import make_policy


# ----------------------------------------------------------------------------- 1. positions in the cache
def cache_positions(original: Tensor) -> Tensor:
    """StreamingLLM's position re-assignment: the rank of each slot's original position.

    original: [S] original positions of the cached tokens, in slot order (a ring buffer is not
    sorted). Returns [S]: 0 for the oldest cached token, ..., S-1 for the newest.
    """
    return original.argsort().argsort()


@exercise("03.cache_positions", "Exercise 1 (positions inside the cache)", cache_positions)
def _check_cache_positions(fn) -> None:
    cases = [torch.tensor([0, 1, 2, 3, 20, 21, 14, 15, 16, 17, 18, 19]),  # sinks + ring buffer
             torch.tensor([0, 1, 2, 3, 4, 5]), torch.tensor([0, 9, 7, 8])]
    for original in cases:
        got = fn(original.clone())
        want = cache_positions(original)
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
        got = policy_trace(model, ids, streaming_policy(streaming_scores, 8, 2, model=model, ranks=fn))
    except ValueError as e:
        raise Wrong(f"in the cache: {e}") from None
    if not close(got[1], want[1], 1e-9):
        raise Wrong("plugged into a StreamingLLM cache (2 sinks + 6 recent slots) your positions give another NLL "
                    "than the course's: every slot must get the rank of its original position among the cached ones")


# ----------------------------------------------------------------------------- 2. re-rotating cached keys
def rerotate(k_rot: Tensor, old_pos: Tensor, new_pos: Tensor, theta: float = 10000.0) -> Tensor:
    """Move keys that were cached *after* rotation to new positions: RoPE(new) = R(new - old) RoPE(old).

    k_rot: [heads, N, d] keys rotated at old_pos [N]; returns them rotated at new_pos [N].
    """
    return rope(k_rot[None], (new_pos - old_pos)[None], theta)[0]


@exercise("03.rerotate", "Exercise 2 (re-rotating cached keys)", rerotate)
def _check_rerotate(fn) -> None:
    g = torch.Generator().manual_seed(0)
    cases = [(torch.tensor([0, 1, 50, 51, 52, 53]), torch.tensor([0, 1, 2, 3, 4, 5]), 1, 10000.0),
             (torch.tensor([0, 1, 2, 3, 907, 904, 905, 906]), torch.tensor([0, 1, 2, 3, 7, 4, 5, 6]), 3, 100000.0)]
    for old, new, heads, theta in cases:
        k = torch.randn(heads, len(old), 8, generator=g, dtype=torch.float64)  # [heads, N, d]
        k_old = rope(k[None], old[None], theta)[0]
        want = rope(k[None], new[None], theta)[0]
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
def rolling_slot(t: int, n_sink: int, window: int) -> int:
    """Slot where token t is written in a preallocated [n_sink | window] cache.

    The first n_sink + window tokens fill the slots in order; afterwards each new token overwrites
    the oldest recent token, cycling through slots n_sink .. n_sink + window - 1. Sinks never move.
    """
    if t < n_sink + window:
        return t
    return n_sink + (t - n_sink) % window


@exercise("03.rolling_slot", "Exercise 3 (a ring buffer that never moves the sinks)", rolling_slot)
def _check_rolling_slot(fn) -> None:
    for n_sink, window in ((4, 6), (1, 3), (0, 5), (2, 2)):
        got = [fn(t, n_sink, window) for t in range(40)]
        want = [rolling_slot(t, n_sink, window) for t in range(40)]
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
def streaming_scores(positions: Tensor, seen: int, n_sink: int) -> Tensor:
    """StreamingLLM's keep-priority of every cached slot (the cache overwrites the lowest when full).

    positions: [H_kv, S] original positions of the cached tokens (slot order); seen: tokens processed
    so far. The first ``n_sink`` tokens of the stream are never evicted (inf); among the others the
    oldest goes first, so the priority is the position itself. Returns [H_kv, S] float.
    """
    return torch.where(positions < n_sink, torch.inf, positions.float())


def _sorted_lists(kept: Tensor) -> list[int]:
    return kept[0, 0].tolist()


@exercise("03.streaming_scores", "Exercise 4 (StreamingLLM as a policy in the real cache)", streaming_scores, points=2)
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
