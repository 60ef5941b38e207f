"""The exercises that plug a student's policy decisions into the real cache (notebooks 03-05): the adapter
(``course.function_policy``) reproduces the course's policies, every checker accepts the reference and other
correct forms and rejects realistic wrong versions with the right hint, and the autograder scores them
from its own process. The solutions come from the solution notebooks (``tests.solutions``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import course.exercises  # noqa: F401  (registers every exercise)
from course.function_policy import FunctionPolicy, h2o_policy, snapkv_policy, streaming_policy
from course.exercises import REGISTRY
from course.exercises.core import result_of
from course.exercises.fixtures import policy_trace, tiny_model, token_ids
from course.instructor.grading.grade import grade
from course.models.llama import rope
from course.policies import make_policy
from tests.instructor.grading_helpers import submission
from tests.solutions import solution

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def streaming_scores(positions, seen, n_sink):
    return solution("03.streaming_scores")(positions, seen, n_sink)


def h2o_accumulate(acc, weights):
    return solution("04.h2o_accumulate")(acc, weights)


def h2o_scores(acc, positions, seen, recent, mean=False):
    return solution("04.h2o_scores")(acc, positions, seen, recent, mean)


def pool_votes(votes, kernel, kind="max"):
    return solution("05.pool_votes")(votes, kernel, kind)


def snapkv_select(attn, capacity, kernel, pooling, kv_heads):
    return solution("05.snapkv_select")(attn, capacity, kernel, pooling, kv_heads)


# ----------------------------------------------------------------------------- wrong and alternative versions
def _group(x: torch.Tensor, kv: int) -> torch.Tensor:  # neighbouring query heads share a KV head
    return x.reshape(kv, x.shape[0] // kv, *x.shape[1:]).mean(1)


def _snapkv(votes_of: Callable, keep_window: bool = True) -> Callable:
    """A SnapKV selection from a scoring rule (attn [H, w, S], kernel, pooling, kv -> [kv, P])."""

    def select(attn, capacity, kernel, pooling, kv_heads):
        w, s = attn.shape[1], attn.shape[-1]
        scores = votes_of(attn, kernel, pooling, kv_heads)
        if not keep_window:
            return scores.topk(capacity, dim=-1).indices
        top = scores.topk(capacity - w, dim=-1).indices
        return torch.cat([top, torch.arange(s - w, s).expand(kv_heads, w)], dim=-1)

    return select


def _prefix_votes(attn):
    return attn[:, :, : attn.shape[-1] - attn.shape[1]].sum(1)


def _pool_across_window(attn, kernel, pooling, kv):
    h, w, s = attn.shape
    pooled = pool_votes(attn.transpose(1, 2).reshape(h * s, w), kernel, pooling).reshape(h, s, w).transpose(1, 2)
    return _group(_prefix_votes(pooled), kv)


def _votes_with_window_keys(attn, capacity, kernel, pooling, kv_heads):
    w, s = attn.shape[1], attn.shape[-1]
    scores = _group(pool_votes(attn.sum(1), kernel, pooling), kv_heads)
    return torch.cat([scores.topk(capacity - w, dim=-1).indices, torch.arange(s - w, s).expand(kv_heads, w)], -1)


def _every_kv_th_head(x, kv):
    return x.reshape(x.shape[0] // kv, kv, *x.shape[1:]).mean(0)


# Every policy exercise: (a realistic wrong implementation, a piece of the hint it must get).
WRONG_POLICIES: dict[str, list[tuple[Callable, str]]] = {
    "03.streaming_scores": [
        (lambda positions, seen, n_sink: positions.float(), "you evicted a pinned sink"),
        (lambda positions, seen, n_sink: torch.where(positions < n_sink, math.inf, -positions.float()),
         "you evicted the newest token"),
        (lambda positions, seen, n_sink: torch.where(positions <= n_sink, math.inf, positions.float()),
         "(off by one)"),
        (lambda positions, seen, n_sink: positions[0].float(), "must return a tensor of shape [2, 10]"),
    ],
    "04.h2o_accumulate": [
        (lambda acc, weights: _group(weights.sum(1), acc.shape[0]), "add to acc"),
        (lambda acc, weights: acc + _group(weights[:, -1], acc.shape[0]), "sum over all rows, not only the last"),
        (lambda acc, weights: acc + _every_kv_th_head(weights.sum(1), acc.shape[0]), "group neighbouring heads"),
        (lambda acc, weights: acc + _group(weights.mean(1), acc.shape[0]), "sum the attention over the rows"),
    ],
    "04.h2o_scores": [
        (lambda acc, positions, seen, recent, mean=False: torch.where(positions >= seen - recent, math.inf,
                                                                      acc / (seen - positions).clamp(min=1)),
         "with mean=False return the raw sums"),  # always the mean rule
        (lambda acc, positions, seen, recent, mean=False: torch.where(positions >= seen - recent, math.inf, acc),
         "with mean=True (the h2o-mean variant) divide acc"),  # never divides
        (lambda acc, positions, seen, recent, mean=False: torch.where(
            positions >= seen - recent, math.inf, acc / (seen - positions + 1) if mean else acc),
         "the divisor is off by one"),
        (lambda acc, positions, seen, recent, mean=False: torch.where(
            positions > seen - recent, math.inf, acc / (seen - positions).clamp(min=1) if mean else acc),
         "the recent window is off by one"),
        (lambda acc, positions, seen, recent, mean=False: acc / (seen - positions).clamp(min=1) if mean else acc,
         "must never be evicted"),
        (lambda acc, positions, seen, recent, mean=False: torch.where(positions >= seen - recent, math.inf, -acc),
         "evicts the *lowest* score"),
        (lambda acc, positions, seen, recent: torch.where(positions >= seen - recent, math.inf, acc),
         "takes a fifth argument, mean=False"),  # the raw rule only, without the parameter
    ],
    "05.snapkv_select": [
        (_snapkv(lambda a, k, p, kv: _group(_prefix_votes(a), kv)), "pool the votes along the keys"),
        (_snapkv(_pool_across_window), "not across the observation window's queries"),
        (_snapkv(lambda a, k, p, kv: pool_votes(_group(_prefix_votes(a), kv), k, p)),
         "then average the GQA group"),
        (_snapkv(lambda a, k, p, kv: _every_kv_th_head(pool_votes(_prefix_votes(a), k, p), kv)),
         "average neighbouring heads"),
        (_snapkv(lambda a, k, p, kv: _group(pool_votes(_prefix_votes(a), k, "avg" if p == "max" else "max"), kv)),
         "use the pooling asked for"),
        (_snapkv(lambda a, k, p, kv: _group(pool_votes(_prefix_votes(a), k, p), kv), keep_window=False),
         "the observation window (the last w slots) is always kept"),
        (_votes_with_window_keys, "vote for the prefix slots 0 .. S-w-1 only"),
    ],
}

# Correct forms other than the reference: scores that rank the same, other ways to write a selection.
ALTERNATIVES: dict[str, list[Callable]] = {
    "03.streaming_scores": [
        lambda positions, seen, n_sink: positions + 1e9 * (positions < n_sink),
        lambda positions, seen, n_sink: torch.where(torch.arange(positions.shape[-1]) < n_sink, math.inf,
                                                    (positions - seen).double()),  # sinks never leave slots 0..n-1
        lambda positions, seen, n_sink: (positions.float() - seen).masked_fill(positions < n_sink, 1e30).tolist(),
    ],
    "04.h2o_accumulate": [
        lambda acc, weights: acc + weights.sum(1).reshape(acc.shape[0], -1, weights.shape[-1]).sum(1),  # x G
        lambda acc, weights: acc.add_(_group(weights.sum(1), acc.shape[0])),  # in place
    ],
    "04.h2o_scores": [
        lambda acc, positions, seen, recent, mean=False: torch.where(
            positions >= seen - recent, 1e9 + positions, acc / (seen - positions).clamp(min=1) if mean else acc),
        lambda acc, positions, seen, recent, mean=False: (acc / (seen - positions) if mean else acc.clone())
        .masked_fill(positions >= seen - recent, math.inf),
        lambda acc, positions, seen, recent, mean=False: torch.where(  # mean x (seen - p) ranks as the raw sum
            positions >= seen - recent, math.inf, acc * (1.0 if mean else 2.0) / ((seen - positions) if mean else 1)),
    ],
    "05.snapkv_select": [
        lambda attn, capacity, kernel, pooling, kv_heads: torch.cat([
            torch.arange(attn.shape[-1] - attn.shape[1], attn.shape[-1]).expand(kv_heads, attn.shape[1]),
            pool_votes(attn[:, :, : attn.shape[-1] - attn.shape[1]].mean(1), kernel, pooling)
            .reshape(kv_heads, -1, attn.shape[-1] - attn.shape[1]).sum(1)
            .argsort(-1, descending=True)[:, : capacity - attn.shape[1]]], dim=-1),
    ],
}


@pytest.mark.parametrize("exercise_id, index", [(e, i) for e in sorted(WRONG_POLICIES)
                                                for i in range(len(WRONG_POLICIES[e]))])
def test_wrong_policy_gets_its_hint(exercise_id, index):
    fn, hint = WRONG_POLICIES[exercise_id][index]
    status, feedback = result_of(REGISTRY[exercise_id], fn)
    assert status == "wrong" and hint in feedback, (status, feedback)


@pytest.mark.parametrize("exercise_id, index", [(e, i) for e in sorted(ALTERNATIVES)
                                                for i in range(len(ALTERNATIVES[e]))])
def test_other_correct_forms_pass(exercise_id, index):
    assert result_of(REGISTRY[exercise_id], ALTERNATIVES[exercise_id][index]) == ("pass", "correct")


def test_cache_positions_is_checked_in_the_cache():
    """Right on the checker's hand-made rows (12, 6 and 4 slots) but not on the 8-slot rows of a real cache."""
    status, feedback = result_of(REGISTRY["03.cache_positions"],
                                 lambda original: original if len(original) == 8 else original.argsort().argsort())
    assert status == "wrong" and "another NLL" in feedback, feedback


# ----------------------------------------------------------------------------- the adapter
def _same_run(a, b) -> bool:
    (kept_a, nll_a), (kept_b, nll_b) = a, b
    return len(kept_a) == len(kept_b) and all(map(torch.equal, kept_a, kept_b)) and torch.equal(nll_a, nll_b)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_function_policies_reproduce_the_course_policies(family):
    model, ids = tiny_model(family), token_ids(40, seed=7)
    streaming = streaming_policy(streaming_scores, 10, 3, model=model, ranks=lambda p: p.argsort().argsort())
    assert streaming.position_rule == make_policy("streaming", 10, sinks=3, model=model).position_rule
    assert streaming.position_rule == ("cache" if family == "llama" else "original")
    reference = make_policy("streaming", 10, sinks=3, model=model)
    assert _same_run(policy_trace(model, ids, streaming), policy_trace(model, ids, reference))
    h2o = h2o_policy(h2o_accumulate, h2o_scores, 12, model=model, recent=5)
    reference = make_policy("h2o", 12, recent=5, model=model)
    assert _same_run(policy_trace(model, ids, h2o, 20), policy_trace(model, ids, reference, 20))
    snap = snapkv_policy(snapkv_select, 12, model=model, obs_window=4, kernel=3, pooling="avg")
    reference = make_policy("snapkv", 12, model=model, obs_window=4, kernel=3, pooling="avg")
    assert _same_run(policy_trace(model, ids, snap, 30), policy_trace(model, ids, reference, 30))


def test_the_cache_uses_the_policys_position_reassignment():
    model, ids = tiny_model("llama"), token_ids(30, seed=8)
    course_run = policy_trace(model, ids, make_policy("streaming", 8, sinks=2, model=model))
    original = policy_trace(model, ids, streaming_policy(streaming_scores, 8, 2, model=model, ranks=lambda p: p))
    assert all(map(torch.equal, original[0], course_run[0]))  # the same tokens ...
    assert not torch.allclose(original[1][8:], course_run[1][8:])  # ... at other positions, once the cache is full
    assert torch.equal(original[1][:7], course_run[1][:7])  # while nothing was evicted, ranks are the positions


def test_functions_get_copies_and_wrong_answers_name_the_function():
    model, ids = tiny_model("llama"), token_ids(20)

    def scribbles(positions, seen, n_sink):
        scores = torch.where(positions < n_sink, math.inf, positions.float())
        positions.fill_(0)  # a student's in-place edit must not reach the cache
        return scores

    assert _same_run(policy_trace(model, ids, streaming_policy(scribbles, 6, 2, model=model)),
                     policy_trace(model, ids, make_policy("streaming", 6, sinks=2, model=model)))
    with pytest.raises(ValueError, match=r"scores function must return a tensor of shape \[2, 6\], got shape \[6\]"):
        policy_trace(model, ids, streaming_policy(lambda p, s, n: p[0], 6, 2, model=model))
    with pytest.raises(ValueError, match="the scores function must return a tensor .* got str"):
        policy_trace(model, ids, streaming_policy(lambda p, s, n: "lowest first", 6, 2, model=model))
    with pytest.raises(ValueError, match=r"slot indices \(integers 0 \.\. 18\)"):
        policy_trace(model, ids, snapkv_policy(lambda a, c, k, p, kv: torch.full((kv, c), 0.5), 8, model=model), 19)
    with pytest.raises(ValueError, match="8 different slots per KV head"):
        policy_trace(model, ids, snapkv_policy(lambda a, c, k, p, kv: torch.zeros(kv, c, dtype=torch.long), 8,
                                               model=model), 19)
    with pytest.raises(ValueError, match="budget must be an integer >= 1 or None, got 0"):
        FunctionPolicy(lambda p, s, n: p, 0)
    with pytest.raises(ValueError, match="positions must be 'original' or 'cache'"):
        FunctionPolicy(lambda p, s, n: p, 4, positions="inside")


def test_builders_refuse_what_make_policy_refuses():
    gpt2 = tiny_model("gpt2")
    with pytest.raises(ValueError, match="budget must exceed the 4 pinned sinks"):
        streaming_policy(streaming_scores, 4, 4, model=gpt2)
    with pytest.raises(ValueError, match="recent must be at most the budget"):
        h2o_policy(h2o_accumulate, h2o_scores, 8, recent=9)
    with pytest.raises(ValueError, match="pooling must be 'avg' or 'max'"):
        snapkv_policy(snapkv_select, 8, pooling="mean")


# ----------------------------------------------------------------------------- under the autograder
H2O_ALWAYS_MEAN = ("def h2o_scores(acc, positions, seen, recent, mean=False):\n"
                   "    return torch.where(positions >= seen - recent, math.inf, acc / (seen - positions).clamp(min=1))\n")
SNAPKV_UNPOOLED = ("def snapkv_select(attn, capacity, kernel, pooling, kv_heads):\n"
                   "    h, w, s = attn.shape\n"
                   "    votes = observation_votes(attn).reshape(kv_heads, h // kv_heads, -1).mean(1)\n"
                   "    top = votes.topk(capacity - w, dim=-1).indices\n"
                   "    return torch.cat([top, torch.arange(s - w, s).expand(kv_heads, w)], dim=-1)\n")


@pytest.mark.slow
def test_the_grader_scores_policy_exercises_from_its_own_process(tmp_path, grading_key):
    """The checker runs the grader's decode loop; the student's functions answer from the kernel."""
    root = tmp_path / "subs"
    submission(root / "ann" / "ps3", NOTEBOOKS / "03_streaming_llm.ipynb")
    submission(root / "ann" / "ps4", NOTEBOOKS / "04_h2o.ipynb", {"h2o_scores": H2O_ALWAYS_MEAN})
    submission(root / "ann" / "ps5", NOTEBOOKS / "05_snapkv.ipynb", {"snapkv_select": SNAPKV_UNPOOLED})
    rows = {r["exercise"]: r for r in grade([root], timeout=300, key=grading_key)}
    for exercise in ("03.cache_positions", "03.streaming_scores", "04.h2o_accumulate", "03.rolling_step",
                     "05.snapkv_compress"):
        assert rows[exercise]["status"] == "pass" and rows[exercise]["points"] == rows[exercise]["max_points"] > 0, \
            rows[exercise]
    assert rows["04.h2o_scores"]["status"] == "wrong" and rows["04.h2o_scores"]["points"] == 0
    assert "with mean=False return the raw sums" in rows["04.h2o_scores"]["feedback"]
    assert rows["05.snapkv_select"]["status"] == "wrong" and "pool the votes along the keys" in \
        rows["05.snapkv_select"]["feedback"]
    assert all(rows[e]["status"] == "pass" for e in ("05.observation_votes", "05.pool_votes", "05.snapkv_keep"))


def test_rerotate_is_checked_with_the_models_theta():
    def default_theta(k_rot, old_pos, new_pos, theta=10000.0):
        return rope(k_rot[None], (new_pos - old_pos)[None], 10000.0)[0]

    status, feedback = result_of(REGISTRY["03.rerotate"], default_theta)
    assert status == "wrong" and "use the theta you are given (100000)" in feedback, feedback
