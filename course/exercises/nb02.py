"""Notebook 02 (attention sinks): references and checkers."""

from __future__ import annotations

import torch
from torch import Tensor

from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close


# ----------------------------------------------------------------------------- 1. sink mass
def sink_mass_per_head(attn: Tensor, k: int = 1, skip: int = 4) -> Tensor:
    """Mean attention mass on the first ``k`` keys, per head. attn: [H, T, T] -> [H].

    Queries before position ``skip`` are left out (they can only look at the first tokens).
    """
    return attn[:, skip:, :k].sum(-1).mean(-1)


def _random_attention(h: int = 3, t: int = 12, seed: int = 0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(h, t, t, generator=g) * 2
    scores[:, :, 0] += 2.0  # some sink
    causal = torch.ones(t, t).tril().bool()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)


@exercise("02.sink_mass_per_head", "Exercise 1 (attention mass on the sink)", sink_mass_per_head)
def _check_sink_mass(fn) -> None:
    attn = _random_attention()
    for k, skip in ((1, 4), (2, 3), (4, 6)):
        got, want = fn(attn, k, skip), sink_mass_per_head(attn, k, skip)
        if close(got, want):
            continue
        if close(got, attn[:, :, :k].sum(-1).mean(-1)):
            raise Wrong("leave out the first `skip` queries: they can only attend to the first tokens")
        if close(got, attn[:, skip:, :k].sum(-1).sum(-1)):
            raise Wrong("average over the queries (mean), do not sum them")
        if close(got, attn[:, :k, skip:].sum(-2).mean(-1)) or close(got, attn[:, skip:, k]):
            raise Wrong("rows are queries and columns are keys: take the first k *columns* (keys) of each row")
        if close(got, attn[:, skip:, :k].mean(-1).mean(-1)):
            raise Wrong("the mass on the first k keys is the *sum* of their weights, not the mean")
        raise Wrong(f"for k={k}, skip={skip} expected {want.tolist()}, got {got!r}")


# ----------------------------------------------------------------------------- 2. which tokens are kept
def kept_positions(t: int, window: int, n_sink: int) -> list[int]:
    """Positions in a [sinks | recent window] cache while token ``t`` is processed (t included).

    The cache holds at most n_sink + window tokens: the first n_sink tokens of the stream and the
    ``window`` most recent ones.
    """
    recent = range(max(0, t - window + 1), t + 1)
    return sorted(set(range(min(n_sink, t + 1))) | set(recent))


@exercise("02.kept_positions", "Exercise 2 (which tokens a sink + window cache keeps)", kept_positions)
def _check_kept_positions(fn) -> None:
    for t, window, n_sink in ((3, 5, 2), (10, 4, 2), (20, 6, 4), (9, 3, 0), (5, 8, 4), (100, 10, 1)):
        want = kept_positions(t, window, n_sink)
        got = fn(t, window, n_sink)
        try:
            got = sorted(int(x) for x in got)
        except TypeError:
            raise Wrong("return a list of token positions (ints)") from None
        if got == want:
            continue
        if len(got) == len(want) + 1 and set(want) <= set(got):
            raise Wrong(f"your cache keeps one token too many at t={t}: the window holds {window} tokens, "
                        "the current token included (off by one)")
        if len(got) == len(want) - 1 and set(got) <= set(want) and t not in got:
            raise Wrong("the current token t is in the cache too: it attends to itself")
        if n_sink and not set(range(min(n_sink, t + 1))) <= set(got):
            raise Wrong(f"the sink was evicted: positions 0..{n_sink - 1} must stay in the cache at t={t}")
        if len(got) != len(set(got)):
            raise Wrong("a token appears twice: early on, the sinks are also among the recent tokens")
        raise Wrong(f"kept_positions({t}, window={window}, n_sink={n_sink}) should be {want}, got {got}")


# ----------------------------------------------------------------------------- 3. evicting from a softmax
def renormalise_without(weights: Tensor, keep: Tensor) -> Tensor:
    """Attention weights after evicting keys: weights [..., S], keep bool [S] -> [..., S].

    Softmax over the kept keys only equals the old weights of the kept keys divided by their sum:
    w'_j = w_j / sum_{i kept} w_i, and 0 for evicted keys.
    """
    kept = weights * keep
    return kept / kept.sum(-1, keepdim=True)


@exercise("02.renormalise_without", "Exercise 3 (what eviction does to a softmax)", renormalise_without)
def _check_renormalise(fn) -> None:
    g = torch.Generator().manual_seed(3)
    weights = torch.softmax(torch.randn(4, 9, generator=g) * 2, -1)
    for keep in (torch.tensor([0, 1, 1, 1, 0, 1, 1, 1, 1]).bool(), torch.arange(9) > 0):
        got, want = fn(weights, keep), renormalise_without(weights, keep)
        if close(got, want):
            continue
        if close(got, weights * keep):
            raise Wrong("after eviction the weights must sum to 1 again: divide by the kept mass")
        if close(got, want * keep + weights * ~keep) or not close((torch.as_tensor(got) * ~keep).abs().sum(), 0.0):
            raise Wrong("evicted keys must get weight 0")
        if close(got, torch.softmax(weights.masked_fill(~keep, float("-inf")), -1)):
            raise Wrong("these are already probabilities: renormalise them, do not apply softmax to them again")
        raise Wrong("expected w_j / sum of kept w for kept keys and 0 for evicted ones")
