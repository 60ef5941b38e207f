"""The checker for executed notebooks (course.instructor.output_check) and its command, on notebooks built here."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from course.__main__ import main
from course.instructor.output_check import check_notebook, check_paths, shown_lines

EXPLORER_LINE = "[cache explorer: interactive, it needs a live Jupyter kernel; run this cell in JupyterLab to use it.]"


def write(path: Path, *outputs) -> Path:
    nb = new_notebook(cells=[new_code_cell("print(1)"), new_code_cell("x", outputs=list(outputs))])
    nbformat.write(nb, str(path))
    return path


def stream(text: str):
    return new_output("stream", name="stdout", text=text)


def shown(text: str, widget: bool = False):
    data = {"text/plain": text}
    if widget:
        data["application/vnd.jupyter.widget-view+json"] = {"model_id": "abc", "version_major": 2, "version_minor": 0}
    return new_output("display_data", data=data)


def test_shown_lines_keep_what_follows_the_last_carriage_return():
    assert shown_lines("a:  10%|\rb\ra: 100%|\nnext\r\n") == ["a: 100%|", "next", ""]


@pytest.mark.parametrize(("output", "problem"), [
    (shown("  0%|          | 0/40 [00:00<?, ?it/s]", widget=True), "progress bar stopped at 0 %"),
    (stream("train:  40%|####      | 4/10\n"), "progress bar stopped at 40 %"),
    (stream("decode:  30%|###\rdecode:  60%|######\n"), "progress bar stopped at 60 %"),
    (shown("VBox(children=(HBox(children=(IntSlider(value=0, description='layer'),)),))", widget=True),
     "widget shown as text"),
    (stream("Loading weights: 100%|██████████| 272/272\n"), "model loading message"),
])
def test_each_kind_of_problem_is_found_with_its_cell(tmp_path, output, problem):
    (found,) = check_notebook(write(tmp_path / "nb.ipynb", output))
    assert (found.cell, found.problem) == (1, problem)
    assert str(tmp_path / "nb.ipynb") in str(found)


def test_clean_outputs_pass(tmp_path):
    nb = write(tmp_path / "nb.ipynb",
               stream("train:  40%|####      | 4/10\ntrain: 100%|##########| 10/10\n"),  # a text bar, finished
               stream("needle:  50%|#####\rneedle: 100%|##########| 8/8\n"),  # a terminal bar, finished
               stream("by hand: 100%|##########| 3/3\n"),
               shown(EXPLORER_LINE, widget=True),
               new_output("execute_result", data={"text/plain": "0.25"}, execution_count=1))
    assert check_notebook(nb) == []


def test_check_paths_reads_folders_and_refuses_what_is_not_a_notebook(tmp_path):
    write(tmp_path / "a.ipynb", stream("x: 100%|#| 1/1\n"))
    write(tmp_path / "b.ipynb", shown("  0%|          | 0/3", widget=True))
    notebooks, problems = check_paths([tmp_path])
    assert [n.name for n in notebooks] == ["a.ipynb", "b.ipynb"] and [Path(p.notebook).name for p in problems] == ["b.ipynb"]
    with pytest.raises(ValueError, match="paths must be executed notebooks"):
        check_paths([tmp_path / "missing.ipynb"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no executed notebooks"):
        check_paths([tmp_path / "empty"])


def test_the_command_exits_2_and_lists_the_problems(tmp_path, capsys):
    write(tmp_path / "good.ipynb", stream("x: 100%|#| 1/1\n"))
    assert main(["check-outputs", str(tmp_path / "good.ipynb")]) == 0
    assert "no frozen progress bar" in capsys.readouterr().out
    write(tmp_path / "bad.ipynb", shown("  0%|          | 0/3", widget=True))
    assert main(["check-outputs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "1 output(s)" in err and "bad.ipynb, cell 1: progress bar stopped at 0 %" in err
