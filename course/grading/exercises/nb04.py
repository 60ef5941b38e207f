"""Notebook 04 (H2O): references and checkers."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from course.grading.core import Wrong, exercise
from course.grading.exercises.fixtures import close
from course.policies import group_mean


# ----------------------------------------------------------------------------- 1. sparsity
def top_fraction_mass(weights: Tensor, fraction: float) -> Tensor:
    """Share of attention held by the top ``fraction`` of keys. weights: [..., S] (rows sum to 1) -> [...].

    The number of keys kept is ceil(fraction * S), at least 1.
    """
    k = max(1, math.ceil(fraction * weights.shape[-1]))
    return weights.topk(k, dim=-1).values.sum(-1)


@exercise("04.top_fraction_mass", "Exercise 1 (how sparse is attention?)", top_fraction_mass)
def _check_top_fraction(fn) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.softmax(torch.randn(3, 5, 40, generator=g) * 3, -1)
    for f in (0.1, 0.25, 0.01):
        got, want = fn(w, f), top_fraction_mass(w, f)
        if close(got, want):
            continue
        k = max(1, math.ceil(f * 40))
        if close(got, w[..., :k].sum(-1)):
            raise Wrong("take the *largest* weights (sort or topk), not the first keys")
        if close(got, w.topk(k, dim=-1).values.mean(-1)):
            raise Wrong("the share of attention is the *sum* of the top weights")
        if close(got, w.topk(max(1, int(f * 40)), dim=-1).values.sum(-1)) or close(got, w.topk(k + 1, dim=-1).values.sum(-1)):
            raise Wrong("keep ceil(fraction * S) keys, at least one")
        raise Wrong(f"for fraction {f} expected {want.flatten()[:3].tolist()}..., got something else")


# ----------------------------------------------------------------------------- 2. accumulated attention
def accumulated_scores(attn: Tensor, kv_heads: int) -> Tensor:
    """H2O's heavy-hitter score of every key after a prompt, per KV head.

    attn: [H, T, T] causal attention of one layer (rows: queries). Each key's received attention is
    summed over queries and divided by the number of queries that could see it (T - j for key j),
    then averaged over the query heads that share a KV head (GQA groups of H / kv_heads). -> [kv_heads, T]
    """
    t = attn.shape[-1]
    mean_received = attn.sum(-2) / torch.arange(t, 0, -1, dtype=attn.dtype)
    return group_mean(mean_received[None], kv_heads)[0]


@exercise("04.accumulated_scores", "Exercise 2 (heavy-hitter scores)", accumulated_scores)
def _check_accumulated(fn) -> None:
    g = torch.Generator().manual_seed(1)
    h, t, kv = 4, 10, 2
    causal = torch.ones(t, t).tril().bool()
    attn = torch.softmax((torch.randn(h, t, t, generator=g) * 2).masked_fill(~causal, -math.inf), -1)
    got, want = fn(attn, kv), accumulated_scores(attn, kv)
    if close(got, want):
        return
    raw = group_mean(attn.sum(-2)[None], kv)[0]
    if close(got, raw):
        raise Wrong("raw sums favour old keys (more queries saw them): divide key j's sum by the T - j queries "
                    "that could attend to it")
    per_query_head = attn.sum(-2) / torch.arange(t, 0, -1)
    if close(got, per_query_head):
        raise Wrong(f"one score per KV head: average the {h // kv} query heads of each GQA group")
    if close(got, group_mean((attn.sum(-1) / t)[None], kv)[0]) or close(got, group_mean(attn.mean(-1)[None], kv)[0]):
        raise Wrong("rows are queries, columns are keys: sum over the query axis (dim -2)")
    grouped_wrong = (attn.sum(-2) / torch.arange(t, 0, -1)).reshape(h // kv, kv, t).mean(0)
    if close(got, grouped_wrong):
        raise Wrong("query heads h*G .. h*G+G-1 share KV head h: group neighbouring heads, not every kv-th one")
    raise Wrong("expected, per KV head, the group-mean of (sum of received attention / number of queries)")


# ----------------------------------------------------------------------------- 3. the victim
def h2o_victim(scores: Tensor, positions: Tensor, seen: int, recent: int, n_sink: int = 0) -> int:
    """The slot H2O evicts: the lowest score among slots that are neither among the ``recent``
    newest tokens (positions >= seen - recent) nor pinned sinks (positions < n_sink).

    scores, positions: [S] for one KV head.
    """
    protected = (positions >= seen - recent) | (positions < n_sink)
    return int(scores.masked_fill(protected, math.inf).argmin())


@exercise("04.h2o_victim", "Exercise 3 (which token H2O evicts)", h2o_victim)
def _check_victim(fn) -> None:
    positions = torch.tensor([0, 1, 7, 3, 9, 5, 8, 4])
    scores = torch.tensor([0.01, 0.3, 0.02, 0.2, 0.001, 0.05, 0.5, 0.15])
    cases = [(10, 3, 0), (10, 3, 1), (10, 0, 0), (10, 6, 1)]
    for seen, recent, n_sink in cases:
        got, want = fn(scores, positions, seen, recent, n_sink), h2o_victim(scores, positions, seen, recent, n_sink)
        if got == want:
            continue
        p = int(positions[got]) if isinstance(got, int) and 0 <= got < len(positions) else None
        if p is None:
            raise Wrong("return the index of a slot (an int between 0 and S-1)")
        if p >= seen - recent:
            raise Wrong(f"you evicted a recent token (position {p}): the newest {recent} tokens are protected")
        if p < n_sink:
            raise Wrong(f"you evicted a pinned sink (position {p})")
        if got == int(scores.argmax()):
            raise Wrong("H2O evicts the *lowest* score, keeping the heavy hitters")
        if got == int(positions.argmin()):
            raise Wrong("that is the oldest token (a sliding window); H2O evicts by score")
        raise Wrong(f"seen={seen}, recent={recent}, n_sink={n_sink}: expected slot {want}, got {got}")
