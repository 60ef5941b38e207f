"""A class graded the way an instructor grades one: every notebook released for graded use (answers hidden, a grading
key), each copy filled in as an honest student would (every solution region pasted in, markers dropped, nothing
else changed) and graded with ``python -m course grade --key --jobs 2``. Every notebook gets full marks with nothing
put up for review and no cell raising; a wrong build costs exactly its points; the key's held-out passages decide
the capstone.

This one run also executes every student copy end to end, on ``gpt2-random`` (GPT-2's code paths offline: the
notebooks' scientific claims are recorded there, not asserted)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import nbformat
import pytest

import course.exercises  # noqa: F401  (registers every exercise)
from course.__main__ import main
from course.exercises import REGISTRY
from course.instructor.solutions import paste_solutions
from tests import alternatives
from tests.instructor.grading_helpers import exercises_only

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NUMBERS = sorted(p.name[:2] for p in NOTEBOOKS.glob("[0-9]*.ipynb"))
WRONG_BUILD = "02.window_stream_nll"
BLANK = ("05", "07")  # notebooks whose later cells use most of the exercises' functions
PINNED = "keep = torch.cat([torch.arange(n_sink), torch.arange(n - window + 1, n)])"
UNPINNED = "keep = torch.arange(n - budget + 1, n)  # the oldest token goes, sinks included"


def _honest(student_copy: Path) -> nbformat.NotebookNode:
    solution = nbformat.read(NOTEBOOKS / student_copy.name, as_version=4)
    return paste_solutions(nbformat.read(student_copy, as_version=4), solution)


def _with_wrong_build(student_copy: Path) -> nbformat.NotebookNode:
    """Notebook 02's exercises, honest but for the build, which evicts the sinks (a known mistake)."""
    nb = exercises_only(_honest(student_copy))
    cell = next(c for c in nb.cells if c.cell_type == "code" and "def window_stream_nll(" in c.source)
    assert PINNED in cell.source
    cell.source = cell.source.replace(PINNED, UNPINNED)
    return nb


def _alternative_students() -> dict[str, dict[str, dict[str, str]]]:
    """{student: {notebook number: {exercise id: the alternative's source}}}: student ``alternative_a`` hands in
    every exercise's ``_a`` file, ``alternative_b`` every ``_b`` file (tests/alternatives)."""
    students: dict[str, dict[str, dict[str, str]]] = {}
    for ex_id, paths in alternatives.files().items():
        for path in paths:
            letter = path.stem[-1]
            students.setdefault(f"alternative_{letter}", {}).setdefault(ex_id[:2], {})[ex_id] = path.read_text()
    return students


def _with_alternatives(student_copy: Path, sources: dict[str, str]) -> nbformat.NotebookNode:
    """The honest copy trimmed to its exercises, each code exercise in ``sources`` written another way."""
    return exercises_only(alternatives.paste(_honest(student_copy), sources))


@pytest.fixture(scope="module")
def graded(graded_release, tmp_path_factory) -> dict:
    student_dir, key = graded_release
    root = tmp_path_factory.mktemp("grading")
    (root / "class" / "honest").mkdir(parents=True)
    (root / "class" / "wrong_build").mkdir()
    for number in NUMBERS:
        [copy] = student_dir.glob(f"{number}_*.ipynb")
        nbformat.write(_honest(copy), root / "class" / "honest" / copy.name)
    [copy_02] = student_dir.glob("02_*.ipynb")
    nbformat.write(_with_wrong_build(copy_02), root / "class" / "wrong_build" / copy_02.name)
    (root / "class" / "blank").mkdir()
    for number in BLANK:  # handed in untouched: the rest of the notebook runs on the course's stand-ins
        [copy] = student_dir.glob(f"{number}_*.ipynb")
        shutil.copy(copy, root / "class" / "blank" / copy.name)
    for student, notebooks in _alternative_students().items():
        (root / "class" / student).mkdir()
        for number, sources in notebooks.items():
            [copy] = student_dir.glob(f"{number}_*.ipynb")
            nbformat.write(_with_alternatives(copy, sources), root / "class" / student / copy.name)
    out = root / "gradebook"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("COURSE_MODEL", "gpt2-random")  # the kernels' model: the student copies' GPT-2 code paths
        assert main(["grade", str(root / "class"), "--key", str(key), "--jobs", "2", "--out", str(out),
                     "--json"]) == 0
    rows = json.loads((out / "gradebook.json").read_text())
    by_student: dict[str, list[dict]] = {}
    for row in rows:
        by_student.setdefault(row["student"], []).append(row)
    return by_student


@pytest.mark.parametrize("number", NUMBERS)
def test_an_honest_student_gets_full_marks_on_every_notebook(graded, number):
    rows = [r for r in graded["honest"] if r["notebook"] == number]
    assert sorted(r["exercise"] for r in rows) == sorted(e for e in REGISTRY if e.startswith(f"{number}."))
    problems = {r["exercise"]: (r["status"], r["feedback"][:300]) for r in rows
                if r["status"] != "pass" or r["points"] != r["max_points"]}
    assert not problems, problems
    assert {r["cells_failed"] for r in rows} == {""}, rows[0]["cells_failed"]


def test_the_whole_course_is_worth_its_points_table(graded):
    earned = sum(r["points"] for r in graded["honest"])
    assert earned == sum(ex.points for ex in REGISTRY.values())
    by_kind: dict[str, int] = {}
    for ex in REGISTRY.values():
        by_kind[ex.kind] = by_kind.get(ex.kind, 0) + ex.points
    assert by_kind["build"] + by_kind["capstone"] > by_kind["question"], by_kind  # the learning is in the builds


def test_a_wrong_build_costs_exactly_its_points(graded):
    rows = {r["exercise"]: r for r in graded["wrong_build"]}
    assert rows[WRONG_BUILD]["status"] == "wrong" and rows[WRONG_BUILD]["points"] == 0
    assert "never evicted" in rows[WRONG_BUILD]["feedback"] and "Hint 3" in rows[WRONG_BUILD]["feedback"]
    others = [r for e, r in rows.items() if e != WRONG_BUILD]
    assert all(r["status"] == "pass" and r["points"] == r["max_points"] for r in others), others


def test_a_blank_copy_scores_nothing_and_runs_to_the_end_on_the_courses_stand_ins(graded):
    """Under the grader an exercise not done hands the notebook the course's own implementation (as AUTOFILL does
    for a student): every later cell still runs."""
    rows = graded["blank"]
    assert {r["notebook"] for r in rows} == set(BLANK)
    assert all(r["status"] == "not_done" and r["points"] == 0 for r in rows), [r for r in rows
                                                                            if r["status"] != "not_done"]
    assert {r["cells_failed"] for r in rows} == {""}, {r["notebook"]: r["cells_failed"] for r in rows}


@pytest.mark.parametrize("student", sorted(_alternative_students()))
def test_correct_solutions_written_differently_get_full_marks(graded, student):
    """Every alternative (tests/alternatives) in its own student's graded copy: a pass with full marks, checked
    in the kernel and again in the stripped world, never forwarded, never put up for review."""
    handed_in = {e for sources in _alternative_students()[student].values() for e in sources}
    rows = {r["exercise"]: r for r in graded[student] if r["exercise"] in handed_in}
    assert sorted(rows) == sorted(handed_in)
    problems = {e: (r["status"], r["points"], r["feedback"][:400]) for e, r in rows.items()
                if r["status"] != "pass" or r["points"] != r["max_points"]}
    assert not problems, problems


def test_every_code_exercise_has_two_alternatives():
    code = sorted(e for e, ex in REGISTRY.items() if ex.kind in ("exercise", "build", "capstone"))
    counts = {e: len(alternatives.files().get(e, [])) for e in code}
    assert all(n >= 2 for n in counts.values()), {e: n for e, n in counts.items() if n < 2}


def test_the_capstone_was_measured_on_the_keys_held_out_passages(graded):
    [row] = [r for r in graded["honest"] if r["exercise"] == "07.my_policy"]
    assert "held-out passages" in row["feedback"] and "n = 24" in row["feedback"], row["feedback"]


def test_the_graded_copies_carry_no_answers(graded_release):
    """Released for graded use, the questions' check cells hold no key: only the grader's key file does."""
    student_dir, key = graded_release
    text = "".join(p.read_text(encoding="utf-8") for p in student_dir.glob("*.ipynb"))
    assert "key=(" not in text and 'answers=\\"hidden\\"' in text
    assert oct(os.stat(key).st_mode & 0o777) == "0o600"


def test_the_points_table_in_the_grading_guide_is_the_registrys():
    from course.instructor.grading.points import points_table

    text = (NOTEBOOKS.parent / "docs" / "grading.md").read_text(encoding="utf-8")
    block = text.split("<!-- points:begin -->\n")[1].split("\n<!-- points:end -->")[0]
    assert block == points_table()
