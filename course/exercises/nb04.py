"""Notebook 04 (H2O): references and checkers."""

from __future__ import annotations

import inspect
import math

import torch
from torch import Tensor

from course.function_policy import h2o_policy
from course.models.llama import rope
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
MEAN_IS_A_VARIANT = ("H2O (the paper, Zhang et al. 2023) ranks keys by the raw sum of the attention they received; "
                     "dividing by the number of queries that saw each key is the h2o-mean variant")


def accumulated_scores(attn: Tensor, kv_heads: int) -> Tensor:
    """H2O's heavy-hitter score of every key after a prompt, per KV head (the paper's raw sums).

    attn: [H, T, T] causal attention of one layer (rows: queries). Each key's received attention is
    summed over the queries, then averaged over the query heads that share a KV head (GQA groups of
    H / kv_heads neighbouring heads). -> [kv_heads, T]
    """
    return group_mean(attn.sum(-2)[None], kv_heads)[0]


def mean_scores(raw: Tensor) -> Tensor:
    """The h2o-mean variant of prompt scores: raw [..., T] divided by the T - j queries that saw key j."""
    t = raw.shape[-1]
    return raw / torch.arange(t, 0, -1, dtype=raw.dtype, device=raw.device)


@exercise("04.accumulated_scores", "Exercise 2 (heavy-hitter scores)", accumulated_scores)
def _check_accumulated(fn) -> None:
    g = torch.Generator().manual_seed(1)
    h, t, kv = 4, 10, 2
    causal = torch.ones(t, t).tril().bool()
    attn = torch.softmax((torch.randn(h, t, t, generator=g) * 2).masked_fill(~causal, -math.inf), -1)
    got, want = fn(attn, kv), accumulated_scores(attn, kv)
    if close(got, want):
        return
    if close(got, mean_scores(want)):
        raise Wrong(MEAN_IS_A_VARIANT + " (section 4 compares both): return the sums")
    if close(got, attn.sum(-2)):
        raise Wrong(f"one score per KV head: average the {h // kv} query heads of each GQA group")
    if close(got, group_mean(attn.sum(-1)[None], kv)[0]) or close(got, group_mean(attn.mean(-1)[None], kv)[0]):
        raise Wrong("rows are queries, columns are keys: sum over the query axis (dim -2)")
    if close(got, attn.sum(-2).reshape(h // kv, kv, t).mean(0)):
        raise Wrong("query heads h*G .. h*G+G-1 share KV head h: group neighbouring heads, not every kv-th one")
    raise Wrong("expected, per KV head, the group-mean of the attention each key received, summed over the queries")


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


def h2o_scores(acc: Tensor, positions: Tensor, seen: int, recent: int, mean: bool = False) -> Tensor:
    """H2O's keep-priority: acc [H_kv, S] (the paper's raw accumulated attention), or with ``mean=True`` the
    h2o-mean variant, acc divided by the number of queries that saw each slot.

    The token at position p has been seen by the queries at p .. seen - 1: seen - p of them. The ``recent``
    newest tokens (positions >= seen - recent) are never evicted (inf). positions: [H_kv, S]. -> [H_kv, S]
    """
    score = acc / (seen - positions).clamp(min=1) if mean else acc
    return torch.where(positions >= seen - recent, math.inf, score)


def _h2o_runs(accumulate, scores, rules=(False,)) -> list[tuple[list[Tensor], Tensor, list[Tensor], Tensor, str]]:
    """(student kept, NLL, reference kept, NLL, setting) for H2O runs on a tiny GQA model: a 16-token
    prompt compressed to the budget, then decoding with eviction; ``rules``: mean=False (H2O) and/or
    mean=True (h2o-mean)."""
    model, ids = tiny_model("llama"), token_ids(36, seed=3)
    runs = []
    for mean in rules:
        name = "h2o-mean" if mean else "h2o"
        for budget, recent in ((10, 4), (8, 2)):
            want = policy_trace(model, ids, make_policy(name, budget, recent=recent, model=model), prompt=16)
            try:
                policy = h2o_policy(accumulate, scores, budget, recent=recent, model=model, mean=mean)
                got = policy_trace(model, ids, policy, prompt=16)
            except ValueError as e:
                raise Wrong(str(e)) from None
            runs.append((*got, *want, f"{name}, budget {budget}, recent {recent}"))
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


def _h2o_scores_hint(fn) -> str | None:
    """A targeted hint from one hand-made cache (10 slots, 3 recent), with either rule; None if none fits."""
    positions = torch.arange(10).expand(2, 10).clone()
    acc = torch.tensor([[3.0, 0.5, 2.1, 0.2, 0.9, 0.3, 1.2, 0.4, 0.3, 1.0],
                        [2.0, 1.5, 0.1, 1.2, 0.4, 0.8, 0.2, 0.6, 0.5, 1.0]])
    seen, recent = 10, 3
    for mean in (False, True):
        got = torch.as_tensor(fn(acc.clone(), positions.clone(), seen, recent, mean=mean)).double()
        kept_always = got >= 1e6
        if not bool(kept_always.any()):
            raise Wrong(f"the {recent} newest tokens must never be evicted: give them the score inf")
        if torch.equal(kept_always, positions > seen - recent) or torch.equal(kept_always, positions >= seen - recent + 1):
            raise Wrong(f"the recent window is off by one: the newest {recent} tokens are positions seen - recent .. "
                        f"seen - 1 ({seen - recent} .. {seen - 1} here)")
        if not torch.equal(kept_always, positions >= seen - recent):
            return None
        rest, divided = ~kept_always, acc / (seen - positions)
        if _same_up_to_scale(-got[rest], (divided if mean else acc)[rest]):
            raise Wrong("the cache evicts the *lowest* score: heavy hitters must score high")
        if not mean and _same_up_to_scale(got[rest], divided[rest]):
            raise Wrong("with mean=False return the raw sums acc: " + MEAN_IS_A_VARIANT + ", asked for by mean=True")
        if mean and _same_up_to_scale(got[rest], acc[rest]):
            raise Wrong("with mean=True (the h2o-mean variant) divide acc by the seen - position queries that saw "
                        "each token")
        if mean and (_same_up_to_scale(got[rest], (acc / (seen - positions + 1))[rest]) or
                     _same_up_to_scale(got[rest], (acc / (seen - positions - 1).clamp(min=1))[rest])):
            raise Wrong("the token at position p has been seen by seen - p queries (p .. seen - 1): the divisor is "
                        "off by one")
    return None


@exercise("04.h2o_scores", "Exercise 5 (H2O's scores, raw and mean, and the recent window in the real cache)",
          h2o_scores, points=2)
def _check_h2o_scores(fn) -> None:
    try:
        inspect.signature(fn).bind(None, None, 0, 0, mean=True)
    except (TypeError, ValueError):
        raise Wrong("h2o_scores takes a fifth argument, mean=False (False: H2O's raw sums; True: the h2o-mean "
                    "variant)") from None
    problems = [p for p in map(_run_differs, _h2o_runs(h2o_accumulate, fn, rules=(False, True))) if p]
    if not problems:
        return
    _h2o_scores_hint(fn)
    raise Wrong(problems[0] + ": the raw sums acc (mean=False) or acc / (seen - position) (mean=True), inf for the "
                "recent tokens")


# ----------------------------------------------------------------------------- 6. build: H2O's decode loop
def h2o_step(state, q: Tensor, k: Tensor, v: Tensor, t: int, budget: int, recent: int, theta: float):
    """One layer's attention for token ``t`` through an H2O cache, built from scratch (decoding, one token a step).

    state: what this layer's cache held after token t - 1 (None before the first token), a dict with
    ``"k"``, ``"v"`` [B, H_kv, S, d] (keys not rotated), ``"pos"`` [B, H_kv, S] (original positions, long) and
    ``"score"`` [B, H_kv, S] (the attention each slot has received so far); q: [B, H, 1, d], k, v: [B, H_kv, 1, d].

    1. If the cache already holds ``budget`` slots, every KV head evicts its lowest-scoring slot among those that
       are not the ``recent`` newest tokens (positions >= t - recent are protected); k, v, pos and score keep
       the remaining slots together.
    2. The new token joins with score 0; keys and query are rotated by their original positions (RoPE, ``theta``);
       each query head attends to its KV head's slots (heads h*G .. h*G+G-1 share KV head h), scaled by 1/sqrt(d).
    3. Every slot's score grows by the attention it just received, summed over the G query heads of its group
       (H2O's raw running sum; a mean over the group ranks the same).
    Returns (output [B, H, 1, d], the new state).
    """
    return _h2o_step(state, q, k, v, t, budget, recent, theta)


def _h2o_step(state, q, k, v, t, budget, recent, theta, group: str = "neighbours", protect: bool = True,
              carry: bool = True, mean: bool = False):
    """``h2o_step`` and its typical mistakes: ``group="first"`` scores a KV head by its group's first query head
    only, ``group="strided"`` sums heads h, h + H_kv, ...; ``protect=False`` may evict the recent tokens;
    ``carry=False`` drops the victim from k, v, pos but not its score (the scores slide onto other slots);
    ``mean=True`` ranks by the mean attention per query that saw a slot (the h2o-mean variant)."""
    b, hkv, _, d = k.shape
    h = q.shape[1]
    g = h // hkv
    new_pos = torch.full((b, hkv, 1), t, dtype=torch.long)
    if state is None:
        state = {"k": k, "v": v, "pos": new_pos, "score": k.new_zeros(b, hkv, 1)}
    else:
        if state["pos"].shape[-1] >= budget:
            rank = state["score"] / (t - state["pos"]).clamp(min=1) if mean else state["score"]
            if protect:
                rank = rank.masked_fill(state["pos"] >= t - recent, float("inf"))
            victim = rank.argmin(dim=-1, keepdim=True)  # [B, H_kv, 1]
            slots = torch.arange(state["pos"].shape[-1]).expand(b, hkv, -1)
            keep = slots[slots != victim].reshape(b, hkv, -1)  # every slot but the victim, in order
            for name in ("k", "v"):
                state[name] = state[name].gather(2, keep[..., None].expand(-1, -1, -1, d))
            state["pos"] = state["pos"].gather(2, keep)
            state["score"] = state["score"].gather(2, keep) if carry else state["score"][..., : keep.shape[-1]]
        state = {"k": torch.cat([state["k"], k], 2), "v": torch.cat([state["v"], v], 2),
                 "pos": torch.cat([state["pos"], new_pos], 2),
                 "score": torch.cat([state["score"], k.new_zeros(b, hkv, 1)], 2)}
    keys = rope(state["k"], state["pos"], theta).repeat_interleave(g, 1)  # [B, H, S, d]
    qr = rope(q, torch.full((b, 1), t), theta)
    w = torch.softmax(qr @ keys.transpose(-1, -2) / d**0.5, dim=-1)  # [B, H, 1, S]
    per_head = w[:, :, 0]  # [B, H, S]
    if group == "neighbours":
        received = per_head.reshape(b, hkv, g, -1).sum(2)
    elif group == "strided":
        received = per_head.reshape(b, g, hkv, -1).sum(1)
    else:
        received = per_head.reshape(b, hkv, g, -1)[:, :, 0]
    state["score"] = state["score"] + received
    return w @ state["v"].repeat_interleave(g, 1), state


_H2O_MISTAKES = [
    (dict(group="first"), "a KV head's score is the attention of all G query heads that share it: sum the group "
                          "(heads h*G .. h*G+G-1), not only one head"),
    (dict(group="strided"), "GQA grouping: query heads h*G .. h*G+G-1 share KV head h; sum neighbouring heads "
                            "(reshape(B, H_kv, G, S)), not every H_kv-th"),
    (dict(protect=False), "the recent window is protected: a slot whose position is >= t - recent is never the "
                          "victim, whatever its score"),
    (dict(carry=False), "the scores must move with their slots: after dropping the victim, gather score with the "
                        "same index as k, v and pos"),
    (dict(mean=True), MEAN_IS_A_VARIANT + ": rank by the running sums themselves"),
]


@torch.inference_mode()
def _course_h2o_trace(model, ids: Tensor, budget: int, recent: int) -> tuple[Tensor, list[Tensor]]:
    """The course's H2O cache, token by token: logits [B, T, vocab] and the sorted kept positions
    [L, B, H_kv, S] after every token (the oracle)."""
    cache = model.new_cache(ids.shape[0], make_policy("h2o", budget, recent=recent, model=model))
    logits, kept = [], []
    for t in range(ids.shape[1]):
        logits.append(model(ids[:, t : t + 1], cache=cache).logits)
        kept.append(torch.stack([layer.live()[2].sort(dim=-1).values for layer in cache.layers]))
    return torch.cat(logits, 1), kept


def _student_h2o_trace(model, ids: Tensor, step, budget: int, recent: int) -> tuple[Tensor, list[Tensor]]:
    """``step`` as every layer's attention (``drive_layers``): logits and the kept positions after every token."""
    from course.exercises.nb03 import drive_layers

    n_layer, seen = model.config.n_layer, []

    def recorded(state, *args):
        out = step(state, *args)
        try:
            seen.append(torch.as_tensor(out[1]["pos"]).sort(dim=-1).values)
        except (TypeError, KeyError, IndexError):
            raise Wrong('the state is a dict with "k", "v", "pos" and "score" (see the docstring)') from None
        return out

    logits = drive_layers(model, ids, recorded, budget, recent)
    try:
        kept = [torch.stack(seen[i : i + n_layer]) for i in range(0, len(seen), n_layer)]
    except RuntimeError:
        raise Wrong("every KV head keeps the same number of slots: state['pos'] is [B, H_kv, S]") from None
    return logits, kept


@exercise("04.h2o_decode", "Build exercise (H2O's accumulate-and-evict decode loop)", h2o_step, points=3)
def _check_h2o_decode(fn) -> None:
    model = tiny_model("llama", seed=6)
    ids = torch.cat([token_ids(18, seed=6), token_ids(18, seed=7)])
    for budget, recent in ((7, 3), (5, 1)):
        want_logits, want_kept = _course_h2o_trace(model, ids, budget, recent)
        got_logits, got_kept = _student_h2o_trace(model, ids, fn, budget, recent)
        step = first_difference(got_kept, want_kept)
        if step is None and close(got_logits, want_logits, 1e-6):
            continue
        for settings, hint in _H2O_MISTAKES:
            wrong = _student_h2o_trace(model, ids, lambda *a, s=settings: _h2o_step(*a, **s), budget, recent)
            if first_difference(got_kept, wrong[1]) is None and close(got_logits, wrong[0], 1e-6):
                raise Wrong(hint)
        if step is None:
            raise Wrong(f"budget {budget}, recent {recent}: the same slots as the course's H2O but other logits: "
                        "rotate keys and query by their original positions, scale by 1/sqrt(d), GQA heads share "
                        "their KV head's slots")
        raise Wrong(f"budget {budget}, recent {recent}: from token {step} on your cache keeps other slots than the "
                    f"course's H2O (it fills at token {budget - 1}); a full cache evicts before the new token attends, "
                    "which then sees exactly budget slots, its own included")
