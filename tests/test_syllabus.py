"""``course.syllabus``, the one table of the course's notebooks: it agrees with the notebooks on disk and the README,
and a notebook added as its own files plus one row reaches every consumer (exercises, points, the command line's
listing, the FAST budget, release and its check, the site)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course import syllabus
from course.__main__ import main
from course.exercises.core import REGISTRY
from course.instructor.syllabus_files import fast_times, fresh_readme

ROOT = Path(__file__).resolve().parents[1]
THROWAWAY = syllabus.Notebook("10_throwaway", "a lesson made up by this test", "throwaway_nb10", fast_budget_s=60)
EXERCISES = '''
from course.exercises.core import Wrong, exercise


@exercise("10.double", "Exercise 1 (double a number)", points=3)
def _check_double(fn):
    if fn(2) != 4:
        raise Wrong("double it")
'''


def test_the_syllabus_is_the_notebooks_on_disk_and_the_readmes_table():
    assert [nb.file for nb in syllabus.notebooks()] == sorted(p.name for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    times = fast_times(ROOT)
    assert times is not None and set(times) == {nb.name for nb in syllabus.notebooks()}
    assert syllabus.readme_table(times) in readme and syllabus.with_readme_table(readme, times) == readme


def test_the_readmes_fast_column_follows_the_measured_times(tmp_path):
    """A new FAST table in docs/notebook-times.md makes the README's table stale until release writes it again."""
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    times = (ROOT / "docs" / "notebook-times.md").read_text(encoding="utf-8")
    seconds = re.search(r"\| 01_kv_cache \| 0 min (\d+ s) \|", times)[1]   # as measured: the minutes change
    times = times.replace("| 01_kv_cache | 0 min", "| 01_kv_cache | 7 min")
    (tmp_path / "docs" / "notebook-times.md").write_text(times, encoding="utf-8")
    row = next(line for line in fresh_readme(tmp_path / "README.md").splitlines() if line.startswith("| `01_kv_cache`"))
    assert row.endswith(f" | 7 min {seconds} |"), row
    (tmp_path / "docs" / "notebook-times.md").unlink()  # no measured times: the two-column table
    assert syllabus.readme_table() in fresh_readme(tmp_path / "README.md")
    assert syllabus.notebook("08").name == "08_quantize_or_evict"


@pytest.mark.parametrize("row, message", [
    (dict(name="9_x", teaches="t"), "name must be two digits"),
    (dict(name="09_x", teaches="t", exercises="not a module!"), "exercises must be a module name"),
    (dict(name="09_x", teaches="t", fast_budget_s=0), "fast_budget_s must be >= 1"),
])
def test_a_bad_row_is_refused_by_name(row, message):
    with pytest.raises(ValueError, match=message):
        syllabus.Notebook(**row)


def test_numbers_out_of_order_and_unknown_notebooks_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="unknown notebook '42'"):
        syllabus.notebook("42")
    monkeypatch.setattr(syllabus, "NOTEBOOKS", syllabus.NOTEBOOKS[::-1])
    with pytest.raises(ValueError, match="different and in order"):
        syllabus.notebooks()


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    """The course with a ninth notebook: its row, its exercise module (on sys.path) and a tiny solution notebook
    in a copy of the repository's notebooks and README. Its exercise leaves the registry afterwards."""
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "throwaway_nb10.py").write_text(EXERCISES, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))
    monkeypatch.setattr(syllabus, "NOTEBOOKS", (*syllabus.NOTEBOOKS, THROWAWAY))
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "notebooks", repo / "notebooks", ignore=shutil.ignore_patterns("student"))
    shutil.copy(ROOT / "README.md", repo / "README.md")
    nb = new_notebook(cells=[new_markdown_cell("# 10: a throwaway lesson", id="intro"),
                             new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
                                           "    ### END SOLUTION", id="ex", execution_count=1)])
    nbformat.write(nb, repo / "notebooks" / THROWAWAY.file)
    yield repo
    REGISTRY.pop("10.double", None)
    sys.modules.pop("throwaway_nb10", None)


def test_a_new_notebook_reaches_exercises_points_and_the_listing(throwaway, capsys):
    from course.exercises.checking import get
    from course.instructor.grading.points import points_by_notebook, points_table

    assert get("10.double").points == 3
    assert points_by_notebook()["10"]["exercise"] == 3 and "| 10 | 3 | 0 | 0 | 0 | 0 | 3 |" in points_table()
    assert main(["notebooks", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["notebooks"]
    assert [r["notebook"] for r in listed][-2:] == ["09_retrieval_heads", "10_throwaway"]
    assert listed[-1]["points"] == 3 and listed[-1]["fast_budget_s"] == 60


def test_a_new_notebook_has_its_own_fast_budget(monkeypatch):
    from course.instructor.notebook_times import budget_verdict

    monkeypatch.setattr(syllabus, "NOTEBOOKS", (*syllabus.NOTEBOOKS, THROWAWAY))
    rows = [{"notebook": THROWAWAY.name, "quiet_s": 61.0}, {"notebook": "01_kv_cache", "quiet_s": 61.0}]
    assert "over in 10_throwaway (quiet, 1 min 01 s)." in budget_verdict(rows)  # not 01: its budget is 3 min
    assert budget_verdict(rows[1:]).endswith("met in every column.")


def test_release_writes_the_new_row_into_the_readme_and_its_check_sees_it(throwaway):
    from course.instructor.release import check_release, release

    solutions, students = throwaway / "notebooks", throwaway / "notebooks" / "student"
    before = {(d.path.name, d.problem) for d in check_release(solutions, students)}
    assert ("README.md", "table of notebooks differs") in before and (THROWAWAY.file, "missing") in before
    written = release(solutions, students)
    assert students / THROWAWAY.file in written and throwaway / "README.md" in written
    assert "| `10_throwaway` | a lesson made up by this test |" in (throwaway / "README.md").read_text()
    assert "raise NotImplementedError()" in (students / THROWAWAY.file).read_text()
    assert check_release(solutions, students) == []
    (solutions / THROWAWAY.file).rename(solutions / "10_unlisted.ipynb")  # a notebook without its row
    problems = {(d.path.name, d.problem) for d in check_release(solutions, students)}
    assert ("10_unlisted.ipynb", "not in course.syllabus") in problems
    assert (THROWAWAY.file, "in course.syllabus, missing") in problems


def test_the_site_shows_the_new_notebook_in_its_place(throwaway, tmp_path):
    from course.instructor.site import build_site

    executed = tmp_path / "executed"
    executed.mkdir()
    shutil.copy(throwaway / "notebooks" / THROWAWAY.file, executed / THROWAWAY.file)
    result = build_site(executed, tmp_path / "site", throwaway, partial=True)
    assert result["notebooks"] == [THROWAWAY.name] and len(result["missing"]) == len(syllabus.NOTEBOOKS) - 1
    index = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert '<a href="10_throwaway.html">10_throwaway</a>' in index and "a lesson made up by this test" in index
    assert index.index("09_retrieval_heads") < index.index("10_throwaway")
