"""Notebook 04 (H2O): checkers, each against the course's own mechanisms."""

from __future__ import annotations

import inspect
import math

import torch
from torch import Tensor

from course.attention_analysis import top_k_mass
from course.builds import drive_layers
from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close, first_difference, generator, policy_trace, tiny_model, token_ids
from course.exercises.hints import hint
from course.function_policy import h2o_policy
from course.kvcache import KVCache, LayerCache
from course.models.attend import attend
from course.models.llama import rope
from course.policies import H2O, PinSinks, accumulate_attention, group_mean, make_policy

_H2O = (H2O, PinSinks, make_policy, accumulate_attention)


def _layer(positions: Tensor, attention: Tensor | None = None) -> LayerCache:
    """A one-row cache layer holding ``positions`` [H_kv, S] (and H2O's running sums ``attention``)."""
    h, s = positions.shape
    layer = LayerCache(torch.zeros(1, h, s, 1), torch.zeros(1, h, s, 1), positions[None].clone().long(), length=s)
    if attention is not None:
        layer.stat("attention")[:] = attention[None].float()
    return layer


# ----------------------------------------------------------------------------- 1. sparsity
def _top_mass_by_sorting(weights: Tensor, fraction: float) -> Tensor:
    """AUTOFILL's sparsity: the course's ``top_k_mass``, each row of weights [..., S] taken as the last query of
    its own causal map (a query that sees all S keys)."""
    s = weights.shape[-1]
    maps = []
    for row in weights.reshape(-1, s):
        attn = torch.zeros(1, 1, s, s, dtype=weights.dtype)
        attn[0, 0, -1] = row
        maps.append(attn)
    return top_k_mass(maps, [fraction], skip=s - 1)[:, 0].reshape(weights.shape[:-1])


@exercise("04.top_fraction_mass", "Exercise 1 (how sparse is attention?)", fallback=_top_mass_by_sorting,
          shortcuts=(top_k_mass,))
def _check_top_fraction(fn) -> None:
    g = generator(0)
    w = torch.softmax(torch.randn(3, 5, 40, generator=g) * 3, -1)
    for f in (0.1, 0.25, 0.01):
        got, want = fn(w, f), _top_mass_by_sorting(w, f)
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


def _accumulate_with_course(acc: Tensor, weights: Tensor) -> Tensor:
    """AUTOFILL's running sums: the course's ``accumulate_attention`` on a layer holding ``acc`` [H_kv, S]."""
    layer = _layer(torch.zeros(acc.shape, dtype=torch.long), acc)
    accumulate_attention(layer, weights[None])
    return layer.stat("attention")[0]


def _prompt_scores_with_course(attn: Tensor, kv_heads: int) -> Tensor:
    """AUTOFILL's prompt scores: the course's accumulation of a whole prompt's attention [H, T, T] from zero."""
    return _accumulate_with_course(torch.zeros(kv_heads, attn.shape[-1]), attn)


def _per_query(raw: Tensor) -> Tensor:
    """The h2o-mean variant of prompt scores: raw [..., T] divided by the T - j queries that saw key j."""
    t = raw.shape[-1]
    return raw / torch.arange(t, 0, -1, dtype=raw.dtype, device=raw.device)


@exercise("04.accumulated_scores", "Exercise 2 (heavy-hitter scores)", fallback=_prompt_scores_with_course,
          shortcuts=(*_H2O, group_mean))
def _check_accumulated(fn) -> None:
    g = generator(1)
    h, t, kv = 4, 10, 2
    causal = torch.ones(t, t).tril().bool()
    attn = torch.softmax((torch.randn(h, t, t, generator=g) * 2).masked_fill(~causal, -math.inf), -1)
    got, want = fn(attn, kv), _prompt_scores_with_course(attn, kv)
    if close(got, want):
        return
    if close(got, _per_query(want)):
        raise Wrong(MEAN_IS_A_VARIANT + " (section 4 compares both): return the sums")
    if close(got, attn.sum(-2)):
        raise Wrong(f"one score per KV head: average the {h // kv} query heads of each GQA group")
    if close(got, group_mean(attn.sum(-1)[None], kv)[0]) or close(got, group_mean(attn.mean(-1)[None], kv)[0]):
        raise Wrong("rows are queries, columns are keys: sum over the query axis (dim -2)")
    if close(got, attn.sum(-2).reshape(h // kv, kv, t).mean(0)):
        raise Wrong("query heads h*G .. h*G+G-1 share KV head h: group neighbouring heads, not every kv-th one")
    raise Wrong("expected, per KV head, the group-mean of the attention each key received, summed over the queries")


# ----------------------------------------------------------------------------- 3. the victim
def _victim_with_course(scores: Tensor, positions: Tensor, seen: int, recent: int, n_sink: int = 0) -> int:
    """The slot the course's H2O (with ``n_sink`` pinned sinks) overwrites in a full cache of one KV head."""
    s = positions.shape[-1]
    policy = H2O(s, recent)
    policy = PinSinks(policy, n_sink) if n_sink else policy
    return int(policy.scores(_layer(positions[None], scores[None]), seen)[0, 0].argmin())


@exercise("04.h2o_victim", "Exercise 3 (which token H2O evicts)", shortcuts=_H2O)
def _check_victim(fn) -> None:
    positions = torch.tensor([0, 1, 7, 3, 9, 5, 8, 4])
    scores = torch.tensor([0.01, 0.3, 0.02, 0.2, 0.001, 0.05, 0.5, 0.15])
    cases = [(10, 3, 0), (10, 3, 1), (10, 0, 0), (10, 6, 1)]
    for seen, recent, n_sink in cases:
        got, want = fn(scores, positions, seen, recent, n_sink), _victim_with_course(scores, positions, seen, recent,
                                                                                     n_sink)
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
def _scores_with_course(acc: Tensor, positions: Tensor, seen: int, recent: int, mean: bool = False) -> Tensor:
    """AUTOFILL's keep-priority: the course's H2O (``mean``: h2o-mean) scores of a cache holding ``positions``."""
    return H2O(positions.shape[-1], recent, normalize=mean).scores(_layer(positions, acc), seen)[0]


def _h2o_runs(accumulate, scores, rules=(False,)) -> list[tuple[list[Tensor], Tensor, list[Tensor], Tensor, str]]:
    """(student kept, NLL, the course's kept, NLL, setting) for H2O runs on a tiny GQA model: a 16-token
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
    """None if the student's run kept the course's slots and gave its NLL, else where it first differs."""
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


@exercise("04.h2o_accumulate", "Exercise 4 (H2O's accumulated, GQA-aware attention in the real cache)", points=2,
          fallback=_accumulate_with_course, shortcuts=(*_H2O, group_mean))
def _check_h2o_accumulate(fn) -> None:
    problems = [p for p in map(_run_differs, _h2o_runs(fn, _scores_with_course)) if p]
    if not problems:
        return
    g = generator(5)
    acc = torch.rand(2, 9, generator=g)
    weights = torch.softmax(torch.randn(4, 3, 9, generator=g), -1)
    got = fn(acc.clone(), weights.clone())
    if _same_up_to_scale(got, _accumulate_with_course(torch.zeros(2, 9), weights)):
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
          points=2, fallback=_scores_with_course, shortcuts=_H2O)
def _check_h2o_scores(fn) -> None:
    try:
        inspect.signature(fn).bind(None, None, 0, 0, mean=True)
    except (TypeError, ValueError):
        raise Wrong("h2o_scores takes a fifth argument, mean=False (False: H2O's raw sums; True: the h2o-mean "
                    "variant)") from None
    problems = [p for p in map(_run_differs, _h2o_runs(_accumulate_with_course, fn, rules=(False, True))) if p]
    if not problems:
        return
    _h2o_scores_hint(fn)
    raise Wrong(problems[0] + ": the raw sums acc (mean=False) or acc / (seen - position) (mean=True), inf for the "
                "recent tokens")


# ----------------------------------------------------------------------------- 6. build: H2O's decode loop
def _h2o_step_with_course(state, q: Tensor, k: Tensor, v: Tensor, t: int, budget: int, recent: int, theta: float):
    """AUTOFILL's build: one layer of the course's H2O cache (the state holds a one-layer ``KVCache`` and, as the
    exercise's state does, the kept positions ``"pos"``)."""
    b, hkv, _, d = k.shape
    if state is None:
        cache = KVCache(1, b, hkv, d, policy=H2O(budget - recent, recent), dtype=k.dtype, device=k.device)
    else:
        cache = state["cache"]
    view = cache.update(0, k, v, torch.full((b, 1), t, device=k.device))
    out, weights = attend(rope(q, view.q_rope, theta), rope(view.keys, view.k_rope, theta), view.values,
                          weight_rows=view.weight_rows)
    cache.observe(0, weights)
    cache.advance(1)
    return out, {"cache": cache, "pos": cache.positions(0).clone()}


@torch.inference_mode()
def _course_h2o_trace(model, ids: Tensor, budget: int, recent: int, name: str = "h2o"
                      ) -> tuple[Tensor, list[Tensor]]:
    """The course's H2O cache, token by token: logits [B, T, vocab] and the sorted kept positions
    [L, B, H_kv, S] after every token (the oracle)."""
    cache = model.new_cache(ids.shape[0], make_policy(name, budget, recent=recent, model=model))
    logits, kept = [], []
    for t in range(ids.shape[1]):
        logits.append(model(ids[:, t : t + 1], cache=cache).logits)
        kept.append(torch.stack([layer.live()[2].sort(dim=-1).values for layer in cache.layers]))
    return torch.cat(logits, 1), kept


def _student_h2o_trace(model, ids: Tensor, step, budget: int, recent: int) -> tuple[Tensor, list[Tensor]]:
    """``step`` as every layer's attention (``drive_layers``): logits and the kept positions after every token."""
    n_layer, seen = model.config.n_layer, []

    def recorded(state, *args):
        out = step(state, *args)
        try:
            seen.append(torch.as_tensor(out[1]["pos"]).sort(dim=-1).values)
        except (TypeError, KeyError, IndexError):
            raise Wrong(hint(2, 'the state is a dict with "k", "v", "pos" and "score" (see the docstring)')) from None
        return out

    try:
        logits = drive_layers(model, ids, recorded, budget, recent)
    except ValueError as e:
        raise Wrong(hint(2, str(e))) from None
    try:
        kept = [torch.stack(seen[i : i + n_layer]) for i in range(0, len(seen), n_layer)]
    except RuntimeError:
        raise Wrong(hint(2, "every KV head keeps the same number of slots: state['pos'] is [B, H_kv, S]")) from None
    return logits, kept


def _same_run(a: tuple[Tensor, list[Tensor]], b: tuple[Tensor, list[Tensor]]) -> bool:
    return first_difference(a[1], b[1]) is None and close(a[0], b[0], 1e-6)


def _diagnose_h2o(fn, model, ids: Tensor, budget: int, recent: int, got) -> str | None:
    """The mistake, as the course's rule that gives the same run, or a probe on a model without GQA."""
    if _same_run(got, _course_h2o_trace(model, ids, budget, 0)):
        return hint(3, "the recent window is protected: a slot whose position is >= t - recent is never the victim, "
                       "whatever its score")
    if _same_run(got, _course_h2o_trace(model, ids, budget, recent, name="h2o-mean")):
        return hint(3, MEAN_IS_A_VARIANT + ": rank by the running sums themselves")
    mha = tiny_model("llama", seed=6, kv_heads=model.config.n_head)
    try:
        right_without_gqa = _same_run(_student_h2o_trace(mha, ids, fn, budget, recent),
                                      _course_h2o_trace(mha, ids, budget, recent))
    except Wrong:
        right_without_gqa = False
    if right_without_gqa:
        return hint(2, "right when every query head has its own KV head, wrong with GQA: a KV head's score is the "
                       "attention of all G query heads that share it, heads h*G .. h*G+G-1 (reshape(B, H_kv, G, S) "
                       "and sum the group)")
    return None


@exercise("04.h2o_decode", "Build exercise (H2O's accumulate-and-evict decode loop)", points=6, kind="build",
          fallback=_h2o_step_with_course, shortcuts=(*_H2O, KVCache, LayerCache, attend, h2o_policy))
def _check_h2o_decode(fn) -> None:
    model = tiny_model("llama", seed=6)
    ids = torch.cat([token_ids(18, seed=6), token_ids(18, seed=7)])
    for budget, recent in ((7, 3), (5, 1)):
        want = _course_h2o_trace(model, ids, budget, recent)
        got = _student_h2o_trace(model, ids, fn, budget, recent)
        if _same_run(got, want):
            continue
        step = first_difference(got[1], want[1])
        diagnosis = _diagnose_h2o(fn, model, ids, budget, recent, got)
        if diagnosis:
            raise Wrong(diagnosis)
        if step is None:
            raise Wrong(hint(1, f"budget {budget}, recent {recent}: the same slots as the course's H2O but other "
                                "logits: rotate keys and query by their original positions, scale by 1/sqrt(d), GQA "
                                "heads share their KV head's slots"))
        raise Wrong(hint(3, f"budget {budget}, recent {recent}: from token {step} on your cache keeps other slots than "
                            f"the course's H2O (it fills at token {budget - 1}); a full cache evicts before the new "
                            "token attends, which then sees exactly budget slots, its own included; the scores move "
                            "with their slots"))
