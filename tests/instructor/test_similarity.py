"""The similarity report: copies show, honest work written independently does not, lines the course gave never
count, and the report is written beside the gradebook (no kernel runs here)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import nbformat
import pytest

from course.instructor.grading.key import GradingKey, line_fingerprint, read_key, released_lines, write_key
from course.instructor.grading.similarity import (COURSE, FILES, Entry, entries_from_rows, similarity_report,
                                                  solution_lines, write_similarity, written_lines)
from tests.instructor.similarity_samples import DISGUISED_BO, HONEST, RELEASED, SOLUTION, filled, pasted_solution

pytest.importorskip("copydetect")


def _key() -> GradingKey:
    """A grading key of notebook 01 alone, as release writes it (the released lines, the course's solutions)."""
    released = released_lines(nbformat.read(RELEASED, as_version=4))
    solutions = solution_lines(json.loads(SOLUTION.read_text(encoding="utf-8")), frozenset(released))
    return GradingKey(notebooks={"01": released}, solutions={"01": solutions})


KEY = _key()


def _class(root: Path, notebooks: dict[str, nbformat.NotebookNode]) -> list[Entry]:
    entries = []
    for student, nb in notebooks.items():
        path = root / student / "01_kv_cache.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
        entries.append(Entry(student, "01", path))
    return entries


def _flagged(report: dict) -> set[frozenset[str]]:
    return {frozenset((p["student_a"], p["student_b"])) for p in report["pairs"] if p["flagged"]}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    """Four students who worked alone, eve who copied bo's work and disguised it, fay who pasted the course's
    solutions, and gus who handed in the released copy untouched."""
    root = tmp_path_factory.mktemp("class")
    notebooks = {name: filled(work) for name, work in HONEST.items()}
    notebooks |= {"eve": filled(DISGUISED_BO), "fay": pasted_solution(), "gus": nbformat.read(RELEASED, 4)}
    return similarity_report(_class(root, notebooks), KEY)


def test_a_disguised_copy_and_a_pasted_solution_are_flagged_and_nothing_else(report):
    assert _flagged(report) == {frozenset(("bo", "eve")), frozenset(("fay", COURSE))}, report["pairs"]
    [copied] = [p for p in report["pairs"] if {p["student_a"], p["student_b"]} == {"bo", "eve"}]
    assert copied["score"] >= 0.8 and copied["share_a"] >= 0.8 and copied["share_b"] >= 0.8
    assert any("torch.cat" in line for line in copied["lines_a"] + copied["lines_b"])
    assert len(copied["lines_a"]) <= 3 and all(len(line) <= 80 for line in copied["lines_a"])
    [pasted] = [p for p in report["pairs"] if p["student_b"] == COURSE and p["student_a"] == "fay"]
    assert pasted["score"] == pasted["share_b"] == 1.0 and pasted["submission_b"] == ""


def test_independent_honest_work_stays_well_under_the_threshold(report):
    honest = set(HONEST)
    scores = [p["score"] for p in report["pairs"] if {p["student_a"], p["student_b"]} <= honest | {COURSE}
              and not {p["student_a"], p["student_b"]} <= {COURSE}]
    assert all(s < report["threshold"] - 0.05 for s in scores), report["pairs"]
    assert report["notebooks"]["01"] == {"submissions": 7, "unreadable": [], "course_solutions": True}


def test_lines_the_course_gave_never_count(tmp_path, report):
    released = nbformat.read(RELEASED, as_version=4)
    assert written_lines(json.loads(nbformat.writes(released)), KEY.released("01")) == []
    assert not any("gus" in (p["student_a"], p["student_b"]) for p in report["pairs"])
    # two students who both run the course's demonstrations twice share only the course's lines: no pair
    demo = next(c.source for c in released.cells if c.cell_type == "code" and len(c.source) > 400
                and "NotImplementedError" not in c.source)
    notebooks = {}
    for name, work in (("ada", HONEST["ada"]), ("cyd", HONEST["cyd"])):
        notebooks[name] = filled(work, extra_cells=(demo, demo))
    without_key = GradingKey(notebooks={}, solutions=KEY.solutions)
    entries = _class(tmp_path, notebooks)
    assert _flagged(similarity_report(entries, KEY)) == set()
    assert frozenset(("ada", "cyd")) in _flagged(similarity_report(entries, without_key))  # the key keeps them out


def test_the_course_solutions_in_the_key_are_the_written_lines_of_the_solution_regions():
    lines = KEY.solutions["01"]
    assert "    return 2 * n_layers * kv_heads * head_dim * tokens * batch * dtype_bytes" in lines
    assert not any("SOLUTION" in line or "NotImplementedError" in line for line in lines)
    assert not any(line_fingerprint(line) in KEY.released("01") for line in lines)


def test_the_report_files_are_written_and_change_no_grade(tmp_path):
    book = tmp_path / "book"
    book.mkdir()
    (book / "gradebook.json").write_text("[]\n")
    entries = _class(tmp_path / "class", {"bo": filled(HONEST["bo"]), "eve": filled(DISGUISED_BO)})
    result = write_similarity(book, entries + [Entry("zed", "01", tmp_path / "missing.ipynb")], KEY)
    assert sorted(p.name for p in book.iterdir()) == sorted(["gradebook.json", *FILES])
    assert (book / "gradebook.json").read_text() == "[]\n"
    assert json.loads((book / "similarity.json").read_text()) == result
    rows = list(csv.DictReader(open(book / "similarity.csv", newline="", encoding="utf-8")))
    assert len(rows) == len(result["pairs"]) and rows[0]["flagged"] == "True"
    assert {rows[0]["student_a"], rows[0]["student_b"]} == {"bo", "eve"}
    markdown = (book / "similarity.md").read_text()
    assert "## 01: bo and eve" in markdown and "changes no grade" in markdown
    assert result["notebooks"]["01"]["unreadable"] == [str(tmp_path / "missing.ipynb")]


def test_a_key_written_before_the_solutions_field_still_reads(tmp_path):
    path = tmp_path / "key.json"
    write_key(KEY, path)
    data = json.loads(path.read_text())
    del data["solutions"]
    path.write_text(json.dumps(data))
    old = read_key(path)
    assert old.solutions == {} and old.notebooks == KEY.notebooks
    entries = _class(tmp_path / "class", {"fay": pasted_solution(), "ada": filled(HONEST["ada"])})
    report = similarity_report(entries, old)
    assert report["pairs"] == [] and report["notebooks"]["01"]["course_solutions"] is False


def test_entries_from_a_gradebook_leave_out_duplicates_and_unattributed_files():
    def row(student, notebook, submission, status="pass"):
        return {"student": student, "notebook": notebook, "submission": submission, "status": status}

    rows = [row("ada", "01", "c/ada/01.ipynb"), row("ada", "01", "c/ada/01.ipynb", "wrong"),
            row("bo", "01", "c/bo/01.ipynb", "duplicate"), row("(unknown)", "", "c/x.ipynb", "error"),
            row("cyd", "02", "c/cyd/02.ipynb", "error")]
    assert entries_from_rows(rows) == [Entry("ada", "01", Path("c/ada/01.ipynb")),
                                       Entry("cyd", "02", Path("c/cyd/02.ipynb"))]


def _graded_by_a_stand_in(monkeypatch, tmp_path: Path) -> Path:
    """Grading replaced by a stand-in that passes every submission (no kernel); returns a key file."""
    from course.instructor.grading import grade as grading
    from course.instructor.grading.gradebook import file_digest

    def graded(sub, *args, **kwargs):
        return [dict(student=sub.student, notebook=sub.notebook, exercise="01.kv_cache_bytes", points=1,
                     max_points=1, status="pass", feedback="", submission=str(sub.path),
                     sha256=file_digest(sub.path), cells_failed="", isolation="bubblewrap")]

    monkeypatch.setattr(grading, "grade_submission", graded)
    key = tmp_path / "key.json"
    write_key(KEY, key)
    return key


def test_grade_writes_the_report_of_every_submission_also_when_it_resumes(tmp_path, monkeypatch):
    """Grading itself is replaced here by a stand-in (no kernel): what is checked is that the report follows."""
    from course.instructor.grading import grade as grading
    from course.instructor.grading.gradebook import Gradebook

    key = _graded_by_a_stand_in(monkeypatch, tmp_path)
    root = tmp_path / "class"
    _class(root, {"bo": filled(HONEST["bo"]), "cyd": filled(HONEST["cyd"])})
    grading.grade([root], gradebook=Gradebook(tmp_path / "book"), key=key)
    assert json.loads((tmp_path / "book" / "similarity.json").read_text())["notebooks"]["01"]["submissions"] == 2
    _class(root, {"eve": filled(DISGUISED_BO)})  # a late submission: bo and cyd are kept, not graded again
    seen = []
    grading.grade([root], gradebook=Gradebook(tmp_path / "book"), key=key, progress=seen.append)
    assert sum("kept" in line for line in seen) == 2
    report = json.loads((tmp_path / "book" / "similarity.json").read_text())
    assert _flagged(report) == {frozenset(("bo", "eve"))}
    grading.grade([root], gradebook=Gradebook(tmp_path / "book2"), key=key, similarity=False)
    assert not (tmp_path / "book2" / "similarity.json").exists()


def test_shards_write_no_report_and_their_merge_with_the_key_writes_the_class(tmp_path, monkeypatch, capsys):
    from course.__main__ import main
    from course.instructor.grading import grade as grading
    from course.instructor.grading.gradebook import Gradebook
    from course.instructor.grading.shards import Shard

    key = _graded_by_a_stand_in(monkeypatch, tmp_path)
    root = tmp_path / "class"
    _class(root, {"ada": filled(HONEST["ada"]), "bo": filled(HONEST["bo"]), "eve": filled(DISGUISED_BO),
                  "fay": pasted_solution()})
    for index in range(2):
        grading.grade([root], gradebook=Gradebook(tmp_path / f"shard-{index}"), key=key, shard=Shard(index, 2))
        assert not (tmp_path / f"shard-{index}" / "similarity.json").exists()  # a shard sees part of the class
    assert main(["gradebook", "merge", str(tmp_path / "shard-0"), str(tmp_path / "shard-1"), "--out",
                 str(tmp_path / "all"), "--key", str(key)]) == 0
    report = json.loads((tmp_path / "all" / "similarity.json").read_text())
    assert report["notebooks"]["01"]["submissions"] == 4
    assert _flagged(report) == {frozenset(("bo", "eve")), frozenset(("fay", COURSE))}
    assert "2 flagged pair(s)" in capsys.readouterr().out


def _renamed(code: str) -> str:
    """``code`` with every name it assigns renamed (``x = ...`` -> ``v3 = ...``) and its comments dropped: a paste
    disguised the way a student would disguise it."""
    import re

    names = sorted({m.group(1) for m in re.finditer(r"^\s*(\w+)\s*=[^=]", code, re.M)}, key=len, reverse=True)
    for i, name in enumerate(names):
        code = re.sub(rf"\b{name}\b", f"v{i}", code)
    return "\n".join(line.split("#")[0].rstrip() for line in code.splitlines())


def test_the_bar_against_the_course_is_what_independent_solutions_score():
    """course.instructor.grading.independent_similarity is what the known-right versions score now."""
    from course.instructor.grading.similarity import INDEPENDENT
    from tests.alternatives import independent_similarity

    assert independent_similarity() == INDEPENDENT, "run python -m tests.alternatives --similarity"


@pytest.mark.parametrize("number", [f"{n:02d}" for n in range(1, 10)])
def test_no_independent_solution_is_flagged_and_a_renamed_paste_is(number):
    from course.instructor.grading.similarity import compare_notebook, course_threshold
    from tests.alternatives import written_code_by_student

    texts, solutions = written_code_by_student(number)
    honest = compare_notebook(number, texts, solutions)
    assert texts and not [p for p in honest if p.flagged], honest
    assert all(p.independent is not None for p in honest if p.student_b == COURSE)
    [pasted] = [p for p in compare_notebook(number, {"paster": _renamed(solutions)}, solutions)
                if p.student_b == COURSE]
    assert pasted.flagged and pasted.score >= course_threshold(number) and pasted.overlap >= 100, pasted
