"""Notebook 04 (H2O): references and checkers."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from course.function_policy import h2o_policy
from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close, first_difference, policy_trace, tiny_model, token_ids
from course.policies import group_mean, make_policy


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


# ----------------------------------------------------------------------------- 4-5. H2O as a policy
def h2o_accumulate(acc: Tensor, weights: Tensor) -> Tensor:
    """H2O's running score: acc [H_kv, S] plus the attention every cached slot received now.

    weights: [H, rows, S] attention of the newest ``rows`` queries (a whole prompt at once, then one
    query per decoding step) over the S cached slots. Sum over the queries, then average the G = H / H_kv
    query heads that share a KV head (heads h*G .. h*G+G-1 share KV head h). Returns [H_kv, S].
    """
    h_kv, h = acc.shape[0], weights.shape[0]
    grouped = weights.reshape(h_kv, h // h_kv, *weights.shape[1:]).mean(1)  # [H_kv, rows, S]
    return acc + grouped.sum(1)


def h2o_scores(acc: Tensor, positions: Tensor, seen: int, recent: int) -> Tensor:
    """H2O's keep-priority (mean scores): acc [H_kv, S] divided by the number of queries that saw each slot.

    The token at position p has been seen by the queries at p .. seen - 1: seen - p of them. The ``recent``
    newest tokens (positions >= seen - recent) are never evicted (inf). positions: [H_kv, S]. -> [H_kv, S]
    """
    mean = acc / (seen - positions).clamp(min=1)
    return torch.where(positions >= seen - recent, math.inf, mean)


def _h2o_runs(accumulate, scores) -> list[tuple[list[Tensor], Tensor, list[Tensor], Tensor, str]]:
    """(student kept, NLL, reference kept, NLL, setting) for H2O runs on a tiny GQA model: a 16-token
    prompt compressed to the budget, then decoding with eviction."""
    model, ids = tiny_model("llama"), token_ids(36, seed=3)
    runs = []
    for budget, recent in ((10, 4), (8, 2)):
        want = policy_trace(model, ids, make_policy("h2o", budget, recent=recent, model=model), prompt=16)
        try:
            policy = h2o_policy(accumulate, scores, budget, recent=recent, model=model)
            got = policy_trace(model, ids, policy, prompt=16)
        except ValueError as e:
            raise Wrong(str(e)) from None
        runs.append((*got, *want, f"budget {budget}, recent {recent}"))
    return runs


def _run_differs(run) -> str | None:
    """None if the student's run kept the reference's slots and gave its NLL, else where it first differs."""
    got_kept, got_nll, want_kept, want_nll, setting = run
    step = first_difference(got_kept, want_kept)
    if step is None and close(got_nll, want_nll, 1e-6):
        return None
    where = "right after the prompt was compressed" if step == 0 else f"at decoding step {step}"
    return f"({setting}) your cache keeps other slots than the course's H2O {where}" if step is not None else \
        f"({setting}) same slots, other NLL"


def _same_up_to_scale(a, b) -> bool:
    """Equal up to a positive factor (sums and means over a group rank the same)."""
    try:
        a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
        return a.shape == b.shape and close(a / a.abs().max(), b / b.abs().max())
    except (TypeError, RuntimeError, ValueError):
        return False


@exercise("04.h2o_accumulate", "Exercise 4 (H2O's accumulated, GQA-aware attention in the real cache)", h2o_accumulate,
          points=2)
def _check_h2o_accumulate(fn) -> None:
    problems = [p for p in map(_run_differs, _h2o_runs(fn, h2o_scores)) if p]
    if not problems:
        return
    g = torch.Generator().manual_seed(5)
    acc = torch.rand(2, 9, generator=g)
    weights = torch.softmax(torch.randn(4, 3, 9, generator=g), -1)
    got = fn(acc.clone(), weights.clone())
    if _same_up_to_scale(got, h2o_accumulate(torch.zeros(2, 9), weights)):
        raise Wrong("add to acc: H2O sums the attention a slot received over every query so far, not only this step's")
    if _same_up_to_scale(got, acc + weights[:, -1].reshape(2, 2, 9).mean(1)):
        raise Wrong("every row of weights is a query (a prompt hands them all at once): sum over all rows, "
                    "not only the last")
    if _same_up_to_scale(got, acc + weights.sum(1).reshape(2, 2, 9).mean(0)) or \
            _same_up_to_scale(got, acc * 2 + weights.sum(1).reshape(2, 2, 9).sum(0)):
        raise Wrong("GQA grouping: query heads h*G .. h*G+G-1 share KV head h; group neighbouring heads "
                    "(reshape(H_kv, G, S)), not every H_kv-th one")
    if _same_up_to_scale(got, acc + weights.mean(1).reshape(2, 2, 9).mean(1)):
        raise Wrong("sum the attention over the rows: every query adds what it gave (a mean would count a prompt's "
                    "queries less than a decoding step's)")
    if _same_up_to_scale(got, acc + weights.sum(-1).mean()):
        raise Wrong("sum over the queries (dim 1), keeping one number per key")
    raise Wrong(problems[0] + ": acc + the attention each slot received from all rows, averaged within each GQA group")


@exercise("04.h2o_scores", "Exercise 5 (H2O's mean scores and recent window in the real cache)", h2o_scores, points=2)
def _check_h2o_scores(fn) -> None:
    problems = [p for p in map(_run_differs, _h2o_runs(h2o_accumulate, fn)) if p]
    if not problems:
        return
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]])
    acc = torch.tensor([[3.0, 0.5, 2.1, 0.2, 0.9, 0.3, 1.2, 0.4, 0.3, 1.0],
                        [2.0, 1.5, 0.1, 1.2, 0.4, 0.8, 0.2, 0.6, 0.5, 1.0]])
    seen, recent = 10, 3
    got = torch.as_tensor(fn(acc.clone(), positions.clone(), seen, recent)).double()
    kept_always = got >= 1e6
    if not bool(kept_always.any()):
        raise Wrong(f"the {recent} newest tokens must never be evicted: give them the score inf")
    if torch.equal(kept_always, positions > seen - recent) or torch.equal(kept_always, positions >= seen - recent + 1):
        raise Wrong(f"the recent window is off by one: the newest {recent} tokens are positions seen - recent .. "
                    f"seen - 1 ({seen - recent} .. {seen - 1} here)")
    if torch.equal(kept_always, positions >= seen - recent):
        rest = ~kept_always
        if _same_up_to_scale(got[rest], acc[rest]):
            raise Wrong("raw sums favour old tokens (more queries saw them): divide acc by the seen - position "
                        "queries that saw each token")
        if _same_up_to_scale(got[rest], (acc / (seen - positions + 1))[rest]) or \
                _same_up_to_scale(got[rest], (acc / (seen - positions - 1).clamp(min=1))[rest]):
            raise Wrong("the token at position p has been seen by seen - p queries (p .. seen - 1): the divisor is "
                        "off by one")
        if _same_up_to_scale(-got[rest], (acc / (seen - positions))[rest]):
            raise Wrong("the cache evicts the *lowest* score: heavy hitters must score high")
    raise Wrong(problems[0] + ": mean received attention acc / (seen - position), inf for the recent tokens")
