"""The exercises of the ramp (bytes beyond GQA, attention with a sink logit, a policy of one's own, a written conclusion)
and the checked questions: every checker accepts the solution notebook's version and rejects realistic wrong
versions with the right hint; a question is judged against the answer key (beside the solution notebooks, never in
the package); the pieces of the course they rest on (``course.memory``, ``score_policy``) are exact."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import course.exercises  # noqa: F401  (registers every exercise)
from course.evaluate import continuation_nll
from course.exercises import REGISTRY
from course.exercises.core import Wrong, result_of
from course.exercises.fixtures import tiny_model
from course.exercises.questions import BY_ID, QUESTIONS, judge, normalise_choice
from course.memory import CONFIGS, kv_bytes_per_token
from course.function_policy import score_policy
from course.policies import H2O, PROTECTED, SlidingWindow

from tests.solutions import NUMBERS, answer_key, solution

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def softmax_with_sink(scores, sink_logit):
    return solution("06.softmax_with_sink")(scores, sink_logit)


# ----------------------------------------------------------------------------- wrong implementations
def _fake_quantize(x, bits, dim):  # written out here, as a student would
    low, high = x.amin(dim, keepdim=True), x.amax(dim, keepdim=True)
    step = (high - low) / (2**bits - 1)
    return ((x - low) / step).round().clamp(0, 2**bits - 1) * step + low


def _symmetric_round_trip(x, bits, dim):
    top = x.abs().amax(dim, keepdim=True)
    step = 2 * top / (2**bits - 1)
    return ((x + top) / step).round().clamp(0, 2**bits - 1) * step - top


def _round_trip_2_to_the_b(x, bits, dim):
    low = x.amin(dim, keepdim=True)
    step = (x.amax(dim, keepdim=True) - low) / 2**bits
    return ((x - low) / step).round().clamp(0, 2**bits) * step + low


def _round_trip_floor(x, bits, dim):
    low = x.amin(dim, keepdim=True)
    step = (x.amax(dim, keepdim=True) - low) / (2**bits - 1)
    return ((x - low) / step).floor() * step + low



def _numbers(config) -> int:  # written out here: the wrong versions must not use the course's own formula
    if "kv_lora_rank" in config:
        return config["n_layers"] * (config["kv_lora_rank"] + config["rope_dim"])
    return 2 * config["n_layers"] * config["kv_heads"] * config["head_dim"]


def _bytes(config, bits=16, group_size=None, **change):
    numbers = _numbers({**config, **change})
    return numbers * 2 if bits == 16 else numbers * bits // 8 + numbers // group_size * 4


def _mla_with_k_and_v(config, bits=16, group_size=None):  # a latent counted twice, like K and V
    return 2 * _bytes(config, bits, group_size) if "kv_lora_rank" in config else _bytes(config, bits, group_size)


def _mla_without_rope_key(config, bits=16, group_size=None):
    if "kv_lora_rank" in config:
        return config["n_layers"] * config["kv_lora_rank"] * bits // 8
    return _bytes(config, bits, group_size)


def _no_group_overhead(config, bits=16, group_size=None):
    return _numbers(config) * bits // 8


def _query_heads(config, bits=16, group_size=None):
    return _bytes(config, bits, group_size, kv_heads=config.get("n_heads", config.get("kv_heads")))


def _scale_without_zero_point(config, bits=16, group_size=None):
    numbers = _numbers(config)
    return numbers * bits // 8 + (numbers // group_size * 2 if bits < 16 else 0)


def _sink_scores(q, k):
    return q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5


def _future(t):
    return torch.ones(t, t, dtype=torch.bool).triu(1)


def _attention_no_sink(q, k, v, sink_logit):  # a plain causal softmax: the empty slot forgotten
    return torch.softmax(_sink_scores(q, k).masked_fill(_future(q.shape[1]), -math.inf), -1) @ v


def _attention_sees_the_future(q, k, v, sink_logit):
    return softmax_with_sink(_sink_scores(q, k), sink_logit) @ v


def _attention_masks_after_softmax(q, k, v, sink_logit):
    return (softmax_with_sink(_sink_scores(q, k), sink_logit) * ~_future(q.shape[1])) @ v


def _attention_unscaled(q, k, v, sink_logit):
    return softmax_with_sink((q @ k.transpose(-1, -2)).masked_fill(_future(q.shape[1]), -math.inf), sink_logit) @ v


def _attention_sink_as_first_value(q, k, v, sink_logit):  # the slot's weight spent on token 0's value
    scores = _sink_scores(q, k).masked_fill(_future(q.shape[1]), -math.inf)
    extra = sink_logit[:, None, None].expand(*scores.shape[:2], 1)
    return torch.softmax(torch.cat([scores, extra], -1), -1) @ torch.cat([v, v[:, :1]], 1)


def _attention_bias_on_scores(q, k, v, sink_logit):  # b added to every score: the softmax cancels it
    scores = _sink_scores(q, k) + sink_logit[:, None, None]
    return torch.softmax(scores.masked_fill(_future(q.shape[1]), -math.inf), -1) @ v


def _recency_by_slot(positions, attention, seen, budget):  # slot index as age: wrong once slots are reused
    return torch.arange(positions.shape[-1], dtype=torch.float32).expand(positions.shape).clone()


def _pin_sinks_and_recent(positions, attention, seen, budget):  # inf for the recent window too: over budget
    return attention.masked_fill((positions < 4) | (positions >= seen - budget), math.inf)


def _random_scores(positions, attention, seen, budget):
    return torch.rand(positions.shape)


def _one_score_per_position(positions, attention, seen, budget):  # heads summed away
    return attention.sum(0)


# Every exercise added by the ramp: (a realistic wrong implementation, a piece of the hint it must get).
WRONG_RAMP: dict[str, list[tuple[Callable, str]]] = {
    "01.kv_bytes_per_token": [
        (_mla_with_k_and_v, "no factor 2"),
        (_mla_without_rope_key, "decoupled RoPE key"),
        (_no_group_overhead, "a scale and a zero point"),
        (_query_heads, "not per query head"),
        (_scale_without_zero_point, "a scale AND a zero point"),
    ],
    "06.attention_with_sink": [
        (_attention_no_sink, "the empty slot is missing from the softmax"),
        (_attention_bias_on_scores, "the empty slot is missing from the softmax"),
        (_attention_sees_the_future, "may not see the future"),
        (_attention_masks_after_softmax, "before the softmax (scores -inf), not after"),
        (_attention_unscaled, "1/sqrt(d)"),
        (_attention_sink_as_first_value, "the empty slot has no value"),
        (lambda q, k, v, sink_logit: v, "the output differs from the course's attention"),
        (lambda q, k, v, sink_logit: v[0], "shape [H, T, d]"),
    ],
    "08.round_trip": [
        (lambda x, bits, dim: x, "expected x' = round"),
        (lambda x, bits, dim: x[0], "in the input's shape"),
        (_symmetric_round_trip, "asymmetric quantization"),
        (_round_trip_2_to_the_b, "2^b codes"),
        (_round_trip_floor, "round to the nearest code"),
    ],
    "08.round_values": [
        (lambda v, bits, group: _fake_quantize(v, bits, -1), "one scale per group of"),
        (lambda v, bits, group: _fake_quantize(v, bits, 2), "per token"),
        (lambda v, bits, group: v, "expected each token's channels"),
    ],
    "09.adakv_counts": [
        (lambda scores, budget, safeguard: torch.full((scores.shape[0],), budget), "one top-k over all"),
        (lambda scores, budget, safeguard: torch.bincount(
            scores.flatten().topk(scores.shape[0] * budget).indices // scores.shape[1], minlength=scores.shape[0]),
         "first give every head its safeguard"),
        (lambda scores, budget, safeguard: torch.full((scores.shape[0],), budget + 1), "exactly H_kv x budget"),
    ],
    "09.kv_head_scores": [
        (lambda scores, kv: scores.reshape(scores.shape[0], kv, -1).mean(-1), "not the mean"),
        (lambda scores, kv: scores.reshape(scores.shape[0], -1, kv).amax(1), "group neighbouring heads"),
        (lambda scores, kv: scores, "one score per layer and KV head"),
    ],
    "07.my_policy": [
        (_recency_by_slot, "slot index"),
        (_pin_sinks_and_recent, "budget"),
        (_random_scores, "the same cache gave different scores"),
        (_one_score_per_position, "one score per cached slot"),
    ],
    "07.conclusion": [
        (lambda: "", "write your conclusion"),
        (lambda: "YOUR ANSWER HERE", "write your conclusion"),
        (lambda: "Mine won. H2O lost.", "too short"),
        (lambda: 42, "as a string"),
    ],
}


def _answer(value) -> Callable:
    return lambda: value


def _key_verdict(qid: str, fn: Callable) -> tuple[str, str]:
    """A question's verdict as the grader gives it: well-formed (the checker), then right (the answer key)."""
    status, feedback = result_of(REGISTRY[qid], fn)
    if status != "pass":
        return status, feedback
    try:
        judge(BY_ID[qid], answer_key()[qid].entry(), fn())
    except Wrong as e:
        return "wrong", str(e)
    return "pass", "correct"


# Every question: two of its listed wrong answers, each with the hint it must get (from the answer key).
WRONG_QUESTIONS: dict[str, list[tuple[Callable, str]]] = {
    q.id: [(_answer(wrong), hint) for wrong, hint in list(answer_key()[q.id].hints.items())[:2]] for q in QUESTIONS
}

RAMP_CASES = [(e, i) for e in sorted(WRONG_RAMP) for i in range(len(WRONG_RAMP[e]))]
QUESTION_CASES = [(e, i) for e in sorted(WRONG_QUESTIONS) for i in range(len(WRONG_QUESTIONS[e]))]


@pytest.mark.parametrize("exercise_id", sorted(e for e in WRONG_RAMP if e != "07.conclusion"))
def test_solution_passes(exercise_id):
    assert result_of(REGISTRY[exercise_id], solution(exercise_id)) == ("pass", "correct")


@pytest.mark.parametrize("exercise_id", sorted(WRONG_QUESTIONS))
def test_solution_notebooks_answer_agrees_with_the_key(exercise_id):
    assert _key_verdict(exercise_id, solution(exercise_id)) == ("pass", "correct")


@pytest.mark.parametrize("exercise_id, index", RAMP_CASES)
def test_wrong_version_gets_its_hint(exercise_id, index):
    fn, hint = WRONG_RAMP[exercise_id][index]
    status, feedback = result_of(REGISTRY[exercise_id], fn)
    assert status == "wrong" and hint in feedback, (status, feedback)


@pytest.mark.parametrize("exercise_id, index", QUESTION_CASES)
def test_wrong_answer_gets_its_hint(exercise_id, index):
    fn, hint = WRONG_QUESTIONS[exercise_id][index]
    status, feedback = _key_verdict(exercise_id, fn)
    assert status == "wrong" and hint in feedback, (status, feedback)


def test_choose_policy_tie_goes_to_the_smaller_cache():
    check = REGISTRY["07.choose_policy"]
    reference = solution("07.choose_policy")
    rows = [{"policy": "a", "tokens": 120, "ppl": 5.0}, {"policy": "b", "tokens": 110, "ppl": 5.0},
            {"policy": "c", "tokens": 100, "ppl": 6.0}]
    assert reference(rows, "ppl", 200, False) == "b"
    assert reference(rows, "ppl", 115, False) == "b" and reference(rows, "ppl", 105, False) == "c"

    def first_of_the_best(rows, metric, max_tokens, higher_is_better):  # ties to list order
        fitting = [r for r in rows if r["tokens"] <= max_tokens]
        return (max if higher_is_better else min)(fitting, key=lambda r: r[metric])["policy"]

    status, feedback = result_of(check, first_of_the_best)
    assert status == "wrong" and "ties go to the smaller cache" in feedback


# ----------------------------------------------------------------------------- questions
def test_every_notebook_has_at_least_three_questions_each_with_its_check_cell():
    by_notebook: dict[str, list[str]] = {}
    for q in QUESTIONS:
        by_notebook.setdefault(q.id[:2], []).append(q.id)
    assert sorted(by_notebook) == NUMBERS
    for number, ids in by_notebook.items():
        assert 3 <= len(ids) <= 5, (number, ids)
        [path] = NOTEBOOKS.glob(f"{number}_*.ipynb")
        sources = ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]]
        for qid in ids:
            assert sum(f'check("{qid}",' in s for s in sources) == 1, f"{path.name} has no single check cell for {qid}"


def test_every_notebook_has_at_least_three_graded_exercises():
    question_ids = {q.id for q in QUESTIONS}
    for number in NUMBERS:
        exercises = [e for e in REGISTRY if e.startswith(f"{number}.") and e not in question_ids]
        assert len(exercises) >= 3, (number, exercises)


@pytest.mark.parametrize("question", QUESTIONS, ids=lambda q: q.id)
def test_hints_never_give_the_answer(question):
    key = answer_key()[question.id]
    texts = [key.nudge, *key.hints.values()]
    assert key.answer not in key.hints
    if question.kind == "choice":
        assert all(f"({key.answer})" not in t for t in texts)
    else:
        spelled = {f"{key.answer:g}", f"{key.answer:,}"}
        assert not any(s in t for s in spelled for t in texts), (question.id, spelled)
    for wrong, hint in key.hints.items():  # every listed wrong answer gets its own hint
        assert _key_verdict(question.id, _answer(wrong)) == ("wrong", hint)


def test_answers_are_read_leniently_but_only_as_answers():
    for spelled in ("d", "D", " (d) ", "d)"):
        assert _key_verdict("02.q_why_collapse", _answer(spelled)) == ("pass", "correct"), spelled
    for bad in ("z", "bc", 2, None):
        status, feedback = _key_verdict("02.q_why_collapse", _answer(bad))
        assert status == "wrong" and "answer with one letter" in feedback, (bad, feedback)
    assert _key_verdict("02.q_first_eviction", _answer(64.0)) == ("pass", "correct")
    assert _key_verdict("02.q_first_eviction", _answer(torch.tensor(64))) == ("pass", "correct")
    for bad in ("64", True, float("nan"), [64]):
        status, feedback = _key_verdict("02.q_first_eviction", _answer(bad))
        assert status == "wrong" and "answer with a number" in feedback, (bad, feedback)
    status, feedback = _key_verdict("02.q_first_eviction", _answer(1000))  # an unlisted wrong answer: the nudge
    assert status == "wrong" and "t - W + 1" in feedback
    assert normalise_choice("(c)") == "c" and normalise_choice("cat") is None


def test_without_the_key_a_question_is_only_checked_for_its_form():
    """The package cannot tell a right answer from a wrong one: both are well-formed."""
    right, wrong = answer_key()["02.q_why_collapse"].answer, "a"
    assert right != wrong
    assert result_of(REGISTRY["02.q_why_collapse"], _answer(right)) == result_of(REGISTRY["02.q_why_collapse"],
                                                                                 _answer(wrong)) == ("pass", "correct")


def test_an_unanswered_question_is_not_done():
    def not_done():
        raise NotImplementedError()

    assert result_of(REGISTRY["07.q_recall"], not_done)[0] == "not_done"


# ----------------------------------------------------------------------------- course.memory
def test_bytes_per_token_of_published_configs():
    by_hand = {"Llama-2-7B (MHA)": 2 * 32 * 32 * 128 * 2, "Llama-3-8B (GQA 32:8)": 2 * 32 * 8 * 128 * 2,
               "Falcon-7B (MQA 71:1)": 2 * 32 * 1 * 64 * 2, "DeepSeek-V2 (MLA)": 60 * (512 + 64) * 2}
    for name, want in by_hand.items():
        assert kv_bytes_per_token(CONFIGS[name]) == want
    llama3 = CONFIGS["Llama-3-8B (GQA 32:8)"]
    numbers = 2 * 32 * 8 * 128
    assert kv_bytes_per_token(llama3, 4, 32) == numbers // 2 + numbers // 32 * 4  # data + scale & zero per group
    assert kv_bytes_per_token(llama3, 8, 128) == numbers + numbers // 128 * 4
    assert kv_bytes_per_token(llama3, 32) == 2 * kv_bytes_per_token(llama3)


@pytest.mark.parametrize("config, bits, group_size, message", [
    ({"n_layers": 2, "kv_heads": 2}, 16, None, "config must have the keys"),
    ({"n_layers": 0, "kv_heads": 2, "head_dim": 8}, 16, None, "config\\['n_layers'\\] must be a positive integer"),
    ({"n_layers": 2, "kv_heads": 2, "head_dim": 8}, 2, None, "bits must be 32, 16, 8 or 4"),
    ({"n_layers": 2, "kv_heads": 2, "head_dim": 8}, 4, None, "group_size must be a positive integer"),
    ({"n_layers": 2, "kv_lora_rank": 512, "rope_dim": 64}, 4, 128, "group_size must divide .*576"),
])
def test_bytes_per_token_refuses_bad_input(config, bits, group_size, message):
    with pytest.raises(ValueError, match=message):
        kv_bytes_per_token(config, bits, group_size)


# ----------------------------------------------------------------------------- score_policy
def test_a_score_function_runs_exactly_like_the_policy_it_imitates():
    model = tiny_model("llama", seed=4)
    ids = torch.randint(0, 53, (2, 40), generator=torch.Generator().manual_seed(0))

    def window(positions, attention, seen, budget):
        return positions.float()

    def h2o(positions, attention, seen, budget, recent=4):
        return torch.where(positions >= seen - recent, PROTECTED + positions, attention)  # the paper's raw sums

    pairs = [(score_policy(window, 8), SlidingWindow(8)), (score_policy(h2o, 8), H2O(4, 4))]
    for mine, theirs in pairs:
        assert torch.allclose(continuation_nll(model, ids, 24, mine), continuation_nll(model, ids, 24, theirs),
                              atol=1e-9)


def test_a_score_function_must_return_one_score_per_slot():
    model = tiny_model("llama", seed=4)
    ids = torch.randint(0, 53, (1, 20), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="the scores function must return a tensor of shape"):
        continuation_nll(model, ids, 12, score_policy(lambda p, a, s, b: a.sum(0), 6))
    with pytest.raises(TypeError, match="score_fn must be a function"):
        score_policy("h2o", 6)
    with pytest.raises(ValueError, match="budget must be an integer >= 2"):
        score_policy(lambda p, a, s, b: p.float(), 1)
