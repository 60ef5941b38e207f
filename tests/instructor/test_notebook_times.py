"""The notebook timing benchmark (``python -m course bench --notebooks``) on a tiny notebook built here."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from course.__main__ import main
from course.instructor.notebook_times import times_table

PARAMETERS = 'FAST = False  # small sizes\nSEED = 0'
REPORT_CELL = 'import os\nprint("FAST", FAST, os.environ.get("COURSE_FAST"), os.environ.get("COURSE_PROGRESS"))'


def tiny_notebook(folder: Path, name: str = "01_tiny.ipynb") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cell = new_code_cell(PARAMETERS, metadata={"tags": ["parameters"]})
    nb = new_notebook(cells=[cell, new_code_cell(REPORT_CELL)],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, str(folder / name))
    return folder / name


def printed(path: Path) -> str:
    nb = nbformat.read(str(path), as_version=4)
    return "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))


def test_bench_notebooks_times_quiet_and_competing_runs_and_writes_the_table(tmp_path, capsys):
    tiny_notebook(tmp_path / "nbs")
    report, out = tmp_path / "times.md", tmp_path / "out"
    assert main(["bench", "--notebooks", "--fast", "--competing", "--notebook-dir", str(tmp_path / "nbs"),
                 "--report", str(report), "--out", str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["notebook"] for r in rows] == ["01_tiny"] and rows[0]["quiet_s"] > 0 and rows[0]["competing_s"] > 0
    for executed in (out / "notebooks/01_tiny.ipynb", out / "notebooks/01_tiny.competing.ipynb"):
        assert printed(executed) == "FAST True 1 text\n"  # FAST passed as a parameter, plain-text bars
    text = report.read_text()
    assert "| 01_tiny |" in text and "next to a CPU-bound process" in text and "--fast --competing" in text


def test_times_table_totals_the_rows():
    rows = [{"notebook": "01_a", "quiet_s": 61.0, "competing_s": 90.0}, {"notebook": "02_b", "quiet_s": 4.0,
                                                                         "competing_s": 5.0}]
    lines = times_table(rows).splitlines()
    assert lines[2] == "| 01_a | 1 min 01 s | 1 min 30 s |"
    assert lines[-1] == "| **all** | **1 min 05 s** | **1 min 35 s** |"
    assert times_table([{"notebook": "01_a", "quiet_s": 3.0}]).splitlines()[0] == "| notebook | wall time |"


def test_the_fast_budget_verdict_names_what_is_over():
    from course.instructor.notebook_times import budget_verdict

    ok = [{"notebook": f"0{i}_x", "quiet_s": 100.0, "competing_s": 170.0} for i in range(1, 6)]
    assert budget_verdict(ok).endswith("met in every column.")
    slow = ok[:4] + [{"notebook": "05_x", "quiet_s": 100.0, "competing_s": 200.0}]
    assert "over in 05_x (competing, 3 min 20 s)" in budget_verdict(slow)
    many = ok + [{"notebook": "06_x", "quiet_s": 100.0, "competing_s": 170.0}]  # 6 x 170 s = 17 min
    assert "all (competing, 17 min 00 s)" in budget_verdict(many) and "quiet" not in budget_verdict(many)


@pytest.mark.parametrize(("args", "message"), [
    (["--fast"], "--fast applies to --notebooks only"),
    (["--competing"], "--competing applies to --notebooks or --threads only"),
    (["--threads", "--report", "x.md", "--fast"], "--fast applies to --notebooks only"),
    (["--profile"], "--profile applies to --transformers-cache only"),
])
def test_flags_of_another_benchmark_are_refused_by_name(args, message, capsys):
    assert main(["bench", *args]) == 2
    assert message in capsys.readouterr().err


def test_a_folder_without_notebooks_is_refused(tmp_path, capsys):
    assert main(["bench", "--notebooks", "--notebook-dir", str(tmp_path)]) == 2
    assert "--notebook-dir must hold numbered notebooks" in capsys.readouterr().err


def test_fast_and_full_tables_live_side_by_side_and_full_rows_accumulate(tmp_path):
    from course.instructor.notebook_times import read_times, write_times

    report, names = tmp_path / "times.md", ["01_a", "02_b", "03_c"]
    write_times([{"notebook": n, "quiet_s": 60.0 + i} for i, n in enumerate(names)], report, fast=True, notebooks=names)
    write_times([{"notebook": "02_b", "quiet_s": 600.0}], report, fast=False, notebooks=names)
    text = report.read_text()
    assert text.index("## FAST") < text.index("## Full size")
    assert "Not timed at full size on this machine yet: 01_a, 03_c." in text
    write_times([{"notebook": "03_c", "quiet_s": 1500.0}], report, fast=False, notebooks=names)  # a later run
    assert read_times(report, fast=False) == {"02_b": 600, "03_c": 1500}
    assert "Not timed at full size on this machine yet: 01_a." in report.read_text()
    write_times([{"notebook": n, "quiet_s": 30.0} for n in names], report, fast=True, notebooks=names)  # FAST again
    assert read_times(report) == {n: 30 for n in names} and read_times(report, fast=False)["03_c"] == 1500
    assert "| **all** | **35 min 00 s** |" in report.read_text()  # the full table kept, with its total


def test_a_table_written_before_the_sections_reads_as_fast(tmp_path):
    from course.instructor.notebook_times import read_times

    old = tmp_path / "old.md"
    old.write_text("# Notebook wall times\n\n| notebook | wall time |\n|---|---|\n| 01_a | 0 min 27 s |\n")
    assert read_times(old) == {"01_a": 27}
    with pytest.raises(ValueError, match="no full-size table"):
        read_times(old, fast=False)


@pytest.mark.parametrize(("args", "message"), [
    (["--only", "01"], "--only applies to --notebooks only"),
    (["--notebooks", "--only", "09"], "--only must name notebook numbers of"),
])
def test_only_is_checked_by_name(tmp_path, args, message, capsys):
    tiny_notebook(tmp_path / "nbs")
    assert main(["bench", *args, "--notebook-dir", str(tmp_path / "nbs")]) == 2
    assert message in capsys.readouterr().err


def test_a_competing_run_that_cannot_be_merged_is_refused_before_any_notebook_runs(tmp_path, capsys):
    from course.instructor.notebook_times import write_times

    tiny_notebook(tmp_path / "nbs")
    tiny_notebook(tmp_path / "nbs", "02_other.ipynb")
    report, out = tmp_path / "times.md", tmp_path / "out"
    write_times([{"notebook": "02_other", "quiet_s": 5.0}], report, fast=True)
    assert main(["bench", "--notebooks", "--fast", "--competing", "--only", "01", "--notebook-dir",
                 str(tmp_path / "nbs"), "--report", str(report), "--out", str(out)]) == 2
    assert "has earlier times without a competing column" in capsys.readouterr().err
    assert not (out / "notebooks").exists()  # refused before any notebook ran


ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
_SPAN = r"measured: ((?:\d+ min )?\d+ s) to ((?:\d+ min )?\d+ s)\)?"  # "measured: 15 s to 2 min 49 s"


def _seconds(text: str) -> int:
    """'2 min 49 s' or '15 s' in seconds."""
    minutes, _, seconds = text.rpartition(" min ")
    return 60 * int(minutes or 0) + int(seconds.removesuffix(" s"))


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_each_notebooks_first_cell_quotes_the_times_in_the_table(path):
    """The "How long it runs" paragraph gives the FAST budget and the fastest and slowest notebook of each table in
    docs/notebook-times.md: the text is typed, the table measured, so a new measurement must reach every notebook."""
    import re

    from course.instructor.notebook_times import FAST_BUDGET_S, read_times

    text = " ".join(nbformat.read(str(path), as_version=4).cells[0].source.split())
    fast = re.search(rf"within (\d+) minutes per notebook on two cores \({_SPAN}", text)
    full = re.search(rf"full sizes anywhere \(on two CPU cores, {_SPAN};", text)
    assert fast and full, f"{path.name}: the first cell's 'How long it runs' paragraph is not in its usual words"
    assert int(fast[1]) * 60 == FAST_BUDGET_S["notebook"]
    for match, mode in ((fast.groups()[1:], True), (full.groups(), False)):
        times = read_times(ROOT / "docs/notebook-times.md", fast=mode).values()
        assert [_seconds(t) for t in match] == [min(times), max(times)], f"{path.name}, FAST = {mode}"


def test_a_fast_run_of_the_repositorys_notebooks_rewrites_the_readmes_fast_column(tmp_path, monkeypatch, capsys):
    """bench --notebooks --fast writing the repository's docs/notebook-times.md brings the front page's table along
    (release --check would fail otherwise); the notebooks are not executed here."""
    from course import syllabus
    from course.instructor import notebook_times

    root = Path(__file__).resolve().parents[2]
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "docs").mkdir()
    for nb in syllabus.notebooks():
        (repo / "notebooks" / nb.file).write_text("{}")
    (repo / "README.md").write_text((root / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    rows = [{"notebook": nb.name, "quiet_s": 60.0 + i} for i, nb in enumerate(syllabus.notebooks())]
    monkeypatch.setattr(notebook_times, "time_notebooks", lambda *a, **k: rows)
    assert main(["bench", "--notebooks", "--fast", "--notebook-dir", str(repo / "notebooks"),
                 "--report", str(repo / "docs" / "notebook-times.md"), "--out", str(tmp_path / "out")]) == 0
    assert "and the FAST column of" in capsys.readouterr().out
    readme = (repo / "README.md").read_text(encoding="utf-8")
    assert f"| `{syllabus.notebooks()[0].name}` | {syllabus.notebooks()[0].teaches} | 1 min 00 s |" in readme
    assert f"| `{syllabus.notebooks()[-1].name}` | {syllabus.notebooks()[-1].teaches} | 1 min 08 s |" in readme
