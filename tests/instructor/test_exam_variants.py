"""Every graded release is its own exam (``course.instructor.variants``): from the release's seed a choice question
shows its options in an order of its own and a templated number question numbers of its own. The same seed gives
the same exam, the public answers score no better than chance on it, and an honest student (the solution pasted into
the graded copy) gets full marks. Self-study copies keep the notebooks' own questions. No kernel runs here: the
questions' functions are executed from the cells of the copies."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest
import torch

from course.exercises.core import Wrong
from course.exercises.questions import BY_ID, QUESTIONS, decode_key, judge
from course.instructor.grading.key import VERSION, KeyFileError, measures, read_key
from course.instructor.release import ReleaseError, check_release, load_answer_key, release
from course.instructor.solutions import _definitions, exercise_cells, paste_solutions, solution_functions
from course.instructor.variants import arguments, draw_variants, printed_options, spells

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
KEYS = load_answer_key(NOTEBOOKS)
TEMPLATED = sorted(qid for qid, k in KEYS.items() if k.numbers is not None)
CHOICE = sorted(q.id for q in QUESTIONS if q.kind == "choice")
SEEDS = range(40)


@pytest.fixture(scope="module")
def drawn() -> dict[int, dict]:
    return {seed: draw_variants(KEYS, seed) for seed in SEEDS}


def _graded(folder: Path, seed: int) -> tuple[Path, Path]:
    release(NOTEBOOKS, folder / "student", hidden_answers=True, key_path=folder / "key.json", seed=seed)
    return folder / "student", folder / "key.json"


@pytest.fixture(scope="module")
def exams(tmp_path_factory) -> dict[int, tuple[Path, Path]]:
    """Graded releases: seeds 1 and 2, and seed 1 again."""
    root = tmp_path_factory.mktemp("exams")
    return {name: _graded(root / str(name), seed) for name, seed in (("1", 1), ("2", 2), ("1 again", 1))}


def _public_answers() -> dict[str, object]:
    """The answers anyone can read: the keys in the committed self-study copies' check cells."""
    answers = {}
    for path in sorted((NOTEBOOKS / "student").glob("[0-9]*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            match = re.search(r'check\("(\d\d\.q_\w+)".*?key=\(((?:\s*"[^"]*")+)\)', cell.source, re.S)
            if match:
                answers[match.group(1)] = decode_key("".join(re.findall(r'"([^"]*)"', match.group(2))))["answer"]
    return answers


# ----------------------------------------------------------------------------- what is drawn
def test_most_number_questions_are_templates():
    numbers = [q.id for q in QUESTIONS if q.kind == "number"]
    assert len(TEMPLATED) >= len(numbers) - 1, sorted(set(numbers) - set(TEMPLATED))


def test_different_seeds_draw_different_answers_and_orders(drawn):
    for qid in TEMPLATED:
        answers = {drawn[seed][qid].entry["answer"] for seed in SEEDS}
        assert len(answers) >= 4, (qid, answers)
    for qid in CHOICE:
        assert len({drawn[seed][qid].order for seed in SEEDS}) >= 8, qid
    one, two = drawn[1], drawn[2]
    assert sum(one[q].entry["answer"] != two[q].entry["answer"] for q in TEMPLATED) >= 0.7 * len(TEMPLATED)
    assert sum(one[q].order != two[q].order for q in CHOICE) >= 0.7 * len(CHOICE)


def test_two_graded_releases_with_different_seeds_are_different_exams(exams):
    keys = {name: json.loads(key.read_text()) for name, (_, key) in exams.items()}
    assert keys["1"]["seed"] == 1 and keys["2"]["seed"] == 2 and keys["1"]["version"] == VERSION
    differ = [q for q in TEMPLATED if keys["1"]["questions"][q]["answer"] != keys["2"]["questions"][q]["answer"]]
    assert len(differ) >= 0.7 * len(TEMPLATED), differ
    orders = [q for q in CHOICE
              if keys["1"]["questions"][q]["variant"]["order"] != keys["2"]["questions"][q]["variant"]["order"]]
    assert len(orders) >= 0.7 * len(CHOICE), orders
    for path in exams["1"][0].glob("*.ipynb"):
        assert path.read_bytes() != (exams["2"][0] / path.name).read_bytes(), path.name


def test_the_same_seed_gives_the_same_exam(exams):
    (first, key), (again, key_again) = exams["1"], exams["1 again"]
    assert key.read_bytes() == key_again.read_bytes()
    for path in sorted(first.glob("*.ipynb")):
        assert path.read_bytes() == (again / path.name).read_bytes(), path.name


def test_a_release_without_a_seed_draws_a_secret_one_and_keeps_it(tmp_path, monkeypatch):
    import course.instructor.grading.key as key_module

    monkeypatch.setattr(key_module, "draw_passages", lambda n, rng=None, margin=0: [["emma", 30_000]])
    release(NOTEBOOKS, tmp_path / "student", hidden_answers=True, key_path=tmp_path / "key.json")
    seed = read_key(tmp_path / "key.json").seed
    assert isinstance(seed, int) and 0 <= seed < 2**32
    variants = draw_variants(KEYS, seed)
    assert read_key(tmp_path / "key.json").questions == {qid: v.entry for qid, v in variants.items()}


def test_the_graded_copies_show_their_variant(exams):
    student, key = exams["1"]
    questions = read_key(key).questions
    for path in sorted(student.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        solution = nbformat.read(NOTEBOOKS / path.name, as_version=4)
        shown, printed = printed_options(nb), printed_options(solution)
        text = "\n".join(c.source for c in nb.cells)
        for qid, ex in exercise_cells(nb).items():
            if qid not in BY_ID:
                continue
            variant = questions[qid].get("variant", {})
            if "order" in variant:  # (a) shows the option the notebook prints under variant["order"][0], ...
                assert [shown[qid][new] for new in "abcd"] == [printed[qid][old] for old in variant["order"]], qid
            if "numbers" in variant:
                assert variant["question"] in text, qid
                head = nb.cells[ex.solution].source.split("\n")[0]
                assert head == f"def {ex.name}(" + ", ".join(
                    f"{n}={v!r}" for n, v in arguments(KEYS[qid], variant["numbers"]).items()) + "):", (qid, head)


def test_hints_of_every_variant_are_told_apart_and_never_spell_the_answer(drawn):
    for seed in SEEDS:
        for qid, variant in drawn[seed].items():
            entry = variant.entry
            judge(BY_ID[qid], entry, entry["answer"])
            for wrong, hint in entry["hints"]:
                with pytest.raises(Wrong) as told:
                    judge(BY_ID[qid], entry, wrong)
                assert str(told.value) == hint, (seed, qid, wrong)
            if qid in TEMPLATED:
                assert not any(spells(t, entry["answer"]) for t in [entry["nudge"], *(h for _, h in entry["hints"])])


# ----------------------------------------------------------------------------- who scores what
def test_the_public_answers_score_no_better_than_chance(drawn):
    """The answers of the public answer key and of the self-study copies, handed in on graded releases: right on
    about one choice question in four (the chance of a guess), never on a templated number question."""
    public = _public_answers()
    assert public == {qid: k.answer for qid, k in KEYS.items()}
    right = {qid: 0 for qid in KEYS}
    for seed in SEEDS:
        for qid, variant in drawn[seed].items():
            try:
                judge(BY_ID[qid], variant.entry, public[qid])
                right[qid] += 1
            except Wrong:
                pass
    choice_rate = sum(right[q] for q in CHOICE) / (len(CHOICE) * len(SEEDS))
    assert 0.15 <= choice_rate <= 0.35, choice_rate  # 1/4 expected
    assert all(right[q] == 0 for q in TEMPLATED), {q: right[q] for q in TEMPLATED if right[q]}
    untemplated = [q.id for q in QUESTIONS if q.kind == "number" and q.id not in TEMPLATED]
    chance = (len(CHOICE) / 4 + len(untemplated)) / len(KEYS)  # guessing letters, the notebooks' own numbers
    score = sum(right.values()) / (len(KEYS) * len(SEEDS))
    print(f"public answers on graded releases: {score:.2f} of the questions (chance {chance:.2f}); choice "
          f"{choice_rate:.2f}, templated numbers 0, left as they are: {untemplated}")
    assert score <= chance + 0.05, (score, chance)


def test_the_solutions_answer_every_variant(drawn):
    """The solution notebooks' answer functions, on each variant's numbers (and re-lettered by its order), give
    its answer."""
    functions = {}
    for path in sorted(NOTEBOOKS.glob("[0-9]*.ipynb")):
        functions.update({qid: fn for qid, fn in solution_functions(path).items() if qid in BY_ID})
    assert sorted(functions) == sorted(KEYS)
    for seed in SEEDS:
        for qid, variant in drawn[seed].items():
            got = functions[qid](**arguments(KEYS[qid], variant.numbers)) if variant.numbers else \
                variant.letter(functions[qid]())
            judge(BY_ID[qid], variant.entry, got)


@pytest.mark.parametrize("exam", ["1", "2"])
def test_an_honest_student_gets_every_question_right_on_a_graded_copy(exams, exam):
    """The solution pasted into the graded copy as the class-grading test does it (``paste_solutions``), each
    question's cell run as written and judged by the grader's measurement from the key."""
    student, key = exams[exam]
    measure = measures(read_key(key))
    judged = set()
    for path in sorted(student.glob("*.ipynb")):
        filled = paste_solutions(nbformat.read(path, as_version=4), nbformat.read(NOTEBOOKS / path.name, as_version=4))
        for qid, ex in exercise_cells(filled).items():
            if qid in BY_ID:
                namespace: dict = {}
                exec(compile(_definitions(filled.cells[ex.solution].source), f"{path.name} {qid}", "exec"), namespace)
                measure[qid](namespace[ex.name])  # raises Wrong with the hint otherwise
                judged.add(qid)
    assert judged == set(KEYS)


# ----------------------------------------------------------------------------- self-study and keys
def test_self_study_copies_keep_the_notebooks_questions():
    assert check_release(NOTEBOOKS, NOTEBOOKS / "student") == []
    for path in sorted((NOTEBOOKS / "student").glob("[0-9]*.ipynb")):
        copy = {c.id: c.source for c in nbformat.read(path, as_version=4).cells}
        for cell in nbformat.read(NOTEBOOKS / path.name, as_version=4).cells:
            if "## Check your understanding" in cell.source:
                assert copy[cell.id] == cell.source, path.name


def test_pasting_into_a_self_study_copy_gives_the_solution_cells(tmp_path):
    release(NOTEBOOKS, tmp_path)
    from course.instructor.solutions import without_markers

    for path in sorted(tmp_path.glob("*.ipynb")):
        solution = nbformat.read(NOTEBOOKS / path.name, as_version=4)
        filled = {c.id: c.source for c in paste_solutions(nbformat.read(path, as_version=4), solution).cells}
        for cell in solution.cells:
            if "BEGIN SOLUTION" in cell.source:
                assert filled[cell.id] == without_markers(cell.source), (path.name, cell.id)


def test_a_key_for_the_notebooks_own_questions(grading_key):
    key = read_key(grading_key)
    assert key.seed == 0 and all("variant" not in entry for entry in key.questions.values())
    assert key.questions == {qid: k.entry() for qid, k in KEYS.items()}


def test_an_older_key_is_refused_with_a_clear_message(tmp_path, grading_key):
    data = json.loads(grading_key.read_text())
    data["version"] = 1
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    with pytest.raises(KeyFileError, match="version 1, this course reads 2: release again"):
        read_key(old)


def test_a_notebook_that_disagrees_with_its_template_stops_release(tmp_path):
    notebooks = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS, notebooks, ignore=shutil.ignore_patterns("student"))
    path = notebooks / "01_kv_cache.ipynb"
    path.write_text(path.read_text(encoding="utf-8").replace("has 12 layers and 12 KV heads", "has 16 layers and 12 "
                                                             "KV heads"), encoding="utf-8")
    with pytest.raises(ReleaseError, match="01.q_bytes_per_token: the question printed is not its template's text"):
        release(notebooks, tmp_path / "student")
    assert not (tmp_path / "student").exists()


def test_the_checkers_inputs_are_the_exams_and_a_table_of_public_outputs_does_not_transfer():
    """A student who records the outputs the course gives for the checker's public inputs and answers from that table
    passes where the inputs are the public ones, and fails every graded release: its inputs are drawn from its seed."""
    from course.exercises.core import REGISTRY
    from course.exercises.fixtures import exam, tiny_model
    from course.exercises.nb08 import _values_with_course

    with exam(None):
        public = tiny_model("llama", seed=8).lm_head.weight.clone()
    with exam(12345):
        drawn = tiny_model("llama", seed=8).lm_head.weight.clone()
    assert not torch.equal(public, drawn)

    table: dict = {}

    def recorder(v, bits, group):
        table[(v.numpy().tobytes(), bits, group)] = out = _values_with_course(v, bits, group)
        return out

    def from_the_table(v, bits, group):
        return table[(v.numpy().tobytes(), bits, group)]

    checker = REGISTRY["08.round_values"].checker
    with exam(None):
        checker(recorder)
        checker(from_the_table)  # the public inputs: the table knows every answer
    for seed in (0, 7, 2**31):
        with exam(seed), pytest.raises((KeyError, Wrong)):
            checker(from_the_table)
