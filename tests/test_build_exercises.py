"""The build exercises (notebooks 01 to 06): the student writes a mechanism end to end and the course's
own code is the oracle. Every checker accepts the reference (and correct variants) and rejects the
realistic wrong versions with their hints; the capstone (07) is graded on held-out passages; the questions'
letters are spread and their options of similar length; every notebook has a build-sized exercise."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest
import torch

import course.exercises  # noqa: F401  (registers every exercise)
from course import assets
from course.exercises import REGISTRY, nb01, nb02, nb03, nb04, nb05, nb06
from course.exercises.core import ExerciseFailed, check, outcome, result_of
from course.exercises.questions import QUESTIONS

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _variant(impl, **settings):
    if impl is nb05._snapkv_compress:  # the checker passes pooling positionally; a mistake may replace it
        return lambda m, p, c, w, k, pooling="max": impl(m, p, c, w, k, **{"pooling": pooling, **settings})
    return lambda *args: impl(*args, **settings)


# exercise id -> the reference's implementation with its mistake switches, and (switches, hint) pairs
MISTAKES = {
    "01.greedy_own_attention": (nb01._greedy_decode, nb01._GQA_MISTAKES),
    "02.window_stream_nll": (nb02._stream_nll, nb02._STREAM_MISTAKES),
    "03.rolling_step": (nb03._rolling_step, nb03._ROLLING_MISTAKES),
    "04.h2o_decode": (nb04._h2o_step, nb04._H2O_MISTAKES),
    "05.snapkv_compress": (nb05._snapkv_compress, nb05._SNAPKV_MISTAKES),
    "06.sink_attention_layer": (nb06._sink_layer, nb06._SINK_LAYER_MISTAKES),
}
CASES = [(e, i) for e in MISTAKES for i in range(len(MISTAKES[e][1]))]
# for tests/test_grading.py: every exercise's wrong versions with their hints
WRONG_BUILD = {e: [(_variant(impl, **settings), hint) for settings, hint in mistakes]
               for e, (impl, mistakes) in MISTAKES.items()}


@pytest.mark.parametrize("exercise_id", sorted(MISTAKES))
def test_build_reference_passes(exercise_id):
    ex = REGISTRY[exercise_id]
    assert result_of(ex, ex.reference) == ("pass", "correct")


@pytest.mark.parametrize("exercise_id, index", CASES)
def test_build_mistake_gets_its_hint(exercise_id, index):
    impl, mistakes = MISTAKES[exercise_id]
    settings, hint = mistakes[index]
    status, feedback = result_of(REGISTRY[exercise_id], _variant(impl, **settings))
    assert (status, feedback) == ("wrong", hint)


def test_snapkv_build_accepts_float32_votes_and_other_tie_breaks():
    import torch.nn.functional as F

    def float_votes(model, prompt, capacity, window, kernel, pooling="max"):
        b, p = prompt.shape
        h, hkv = model.config.n_head, model.config.n_kv_head
        cache = model.new_cache(batch=b)
        with torch.inference_mode():
            attns = model(prompt, cache=cache, output_attentions=True).attentions
        for layer, attn in zip(cache.layers, attns):
            votes = attn[:, :, -window:, : p - window].float().sum(2).reshape(b * h, 1, -1)
            pooled = F.max_pool1d(votes, kernel, 1, kernel // 2) if pooling == "max" else \
                F.avg_pool1d(votes, kernel, 1, kernel // 2, count_include_pad=False)
            grouped = pooled.reshape(b, hkv, h // hkv, -1).mean(2).flip(-1)  # reversed: ties break the other way
            best = (p - window - 1) - grouped.topk(capacity - window, -1).indices
            keep = torch.cat([best, torch.arange(p - window, p).expand(b, hkv, window)], -1)
            layer.gather(keep.sort(-1).values)
        return cache

    assert result_of(REGISTRY["05.snapkv_compress"], float_votes) == ("pass", "correct")


def test_build_checkers_reject_what_skips_the_work():
    def calls_the_model(model, prompt, n_new):
        return model(prompt), None

    status, feedback = result_of(REGISTRY["01.greedy_own_attention"], calls_the_model)
    assert status == "error" and "write the forward pass yourself" in feedback

    def recomputes(model, ids, window, n_sink=0):
        out = []
        for t in range(ids.shape[1] - 1):
            lo = max(0, t + 1 - window - n_sink)
            ctx = torch.cat([ids[:, :n_sink], ids[:, max(lo, n_sink) : t + 1]], 1) if t + 1 > n_sink \
                else ids[:, : t + 1]
            logits = model(ctx).logits[:, -1].double()
            out.append(torch.logsumexp(logits, -1) - logits.gather(-1, ids[:, t + 1 : t + 2])[:, 0])
        return torch.stack(out, 1)

    status, feedback = result_of(REGISTRY["02.window_stream_nll"], recomputes)
    assert status == "wrong" and "one token per forward call" in feedback


# ----------------------------------------------------------------------------- reference sizes, from the notebooks
def _reference_lines(source: str) -> int:
    """Non-blank, non-comment lines between ### BEGIN SOLUTION and ### END SOLUTION."""
    inside, n = False, 0
    for line in source.splitlines():
        s = line.strip()
        if s.startswith("### BEGIN SOLUTION"):
            inside = True
        elif s.startswith("### END SOLUTION"):
            inside = False
        elif inside and s and not s.startswith("#"):
            n += 1
    return n


def reference_sizes() -> dict[str, dict[str, int]]:
    """{notebook number: {exercise id: reference lines}} over the solution notebooks' exercises (not questions)."""
    out: dict[str, dict[str, int]] = {}
    for path in sorted(NOTEBOOKS.glob("0*.ipynb")):
        cells = ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]]
        for i, src in enumerate(cells[:-1]):
            if "### BEGIN SOLUTION" not in src:
                continue
            ids = re.findall(r'check\("(\d\d\.\w+)"', "\n".join(cells[i + 1 : i + 3]))
            if ids and ".q_" not in ids[0]:
                out.setdefault(path.name[:2], {})[ids[0]] = _reference_lines(src)
    return out


def test_every_notebook_has_a_build_sized_exercise_and_the_median_is_not_one_line():
    sizes = reference_sizes()
    print({nb: dict(sorted(s.items(), key=lambda kv: -kv[1])) for nb, s in sizes.items()})
    assert sorted(sizes) == ["01", "02", "03", "04", "05", "06", "07"], sorted(sizes)
    for nb in sizes:
        assert max(sizes[nb].values()) >= 12, (nb, sizes[nb])
    everything = [n for s in sizes.values() for n in s.values()]
    print(f"median reference: {statistics.median(everything)} lines")
    assert statistics.median(everything) >= 4, sorted(everything)


# ----------------------------------------------------------------------------- questions
def test_more_computed_answers_than_letters_and_letters_spread():
    choice = [q for q in QUESTIONS if q.is_choice]
    assert len(QUESTIONS) - len(choice) > len(choice)
    counts = {letter: sum(q.answer == letter for q in choice) for letter in "abcd"}
    assert max(counts.values()) <= 0.4 * len(choice), counts


@pytest.mark.parametrize("question", [q for q in QUESTIONS if q.choices], ids=lambda q: q.id)
def test_options_are_four_of_similar_length_and_printed_in_the_notebook(question):
    lengths = [len(c) for c in question.choices]
    assert len(lengths) == 4 and max(lengths) <= 1.5 * min(lengths), (question.id, lengths)
    [path] = NOTEBOOKS.glob(f"{question.id[:2]}_*.ipynb")
    text = path.read_text(encoding="utf-8")
    printed = "  ".join(f"({letter}) {c}" for letter, c in zip("abcd", question.choices))
    assert json.dumps(printed, ensure_ascii=False)[1:-1] in text, question.id


def test_mc_questions_of_the_build_notebooks_all_list_their_options():
    for q in QUESTIONS:
        if q.is_choice and q.id[:2] in ("01", "02", "03", "05", "07"):
            assert len(q.choices) == 4, q.id


def test_hidden_answers_say_only_whether_an_answer_is_well_formed(capsys):
    q = next(q for q in QUESTIONS if q.is_choice)
    wrong = next(letter for letter in "abcd" if letter != q.answer)
    for answer in (q.answer, wrong):
        check(q.id, lambda a=answer: a, answers="hidden")
        assert "the grader decides" in capsys.readouterr().out
    with pytest.raises(ExerciseFailed, match="one letter"):
        check(q.id, lambda: "z", answers="hidden")
    with pytest.raises(ExerciseFailed):  # self-study keeps the immediate verdict
        check(q.id, lambda: wrong)


def test_release_hide_answers_rewrites_only_the_questions_checks():
    from course.instructor.release import hide_answers

    assert hide_answers('q1 = check("01.q_exact", q1, autofill=AUTOFILL)') == \
        'q1 = check("01.q_exact", q1, autofill=AUTOFILL, answers="hidden")'
    same = 'rolling_step = check("03.rolling_step", rolling_step, autofill=AUTOFILL)'
    assert hide_answers(same) == same


# ----------------------------------------------------------------------------- the capstone on held-out passages
def _window_scores(positions, attention, seen, budget):
    return positions.float()


def _random_scores(positions, attention, seen, budget):  # a random priority per token, fixed once drawn
    table = torch.rand(int(positions.max()) + 1, generator=torch.Generator().manual_seed(0))
    return table[positions]


@pytest.mark.skipif(not assets.status()["smollm2-135m"], reason="SmolLM2-135M is not in the course cache")
def test_capstone_grade_depends_on_measured_quality():
    ex = REGISTRY["07.my_policy"]
    results = {name: outcome(ex, fn, graded=True) for name, fn in
               (("reference", ex.reference), ("window", _window_scores), ("random", _random_scores))}
    print(results)
    numbers = {name: re.search(r"yours (\d+\.\d\d), StreamingLLM (\d+\.\d\d), window (\d+\.\d\d)", fb)
               for name, (_, fb, _) in results.items()}
    assert all(numbers.values()), results  # the feedback gives the three perplexities
    ppl = {name: float(m.group(1)) for name, m in numbers.items()}
    assert len(set(ppl.values())) == 3, ppl
    assert results["window"][2] == 0  # the plain window cannot beat itself
    assert results["reference"][2] > results["window"][2], results
    assert len({r[2] for r in results.values()}) >= 2, results


def test_a_grader_measurement_can_give_part_of_the_points():
    from course.exercises.core import Exercise, Partial, Wrong

    def half(fn):
        raise Partial("beats the window, not StreamingLLM", 1)

    def refuse(fn):
        raise Wrong("does not beat the window")

    ex = Exercise("99.x", "x", lambda: 0, lambda fn: None, points=2, graded=half)
    assert outcome(ex, lambda: 0) == ("pass", "correct", 2)  # the notebook's check: no measurement
    assert outcome(ex, lambda: 0, graded=True) == ("partial", "beats the window, not StreamingLLM", 1)
    no_points = Exercise("99.y", "y", lambda: 0, lambda fn: None, points=2, graded=refuse)
    assert outcome(no_points, lambda: 0, graded=True) == ("wrong", "does not beat the window", 0)
    full = Exercise("99.z", "z", lambda: 0, lambda fn: None, points=2, graded=lambda fn: "39.45 < 44.35")
    assert outcome(full, lambda: 0, graded=True) == ("pass", "correct; 39.45 < 44.35", 2)
