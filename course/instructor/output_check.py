"""Check executed notebooks for what a page without a kernel shows badly.

An executed copy (papermill, nbval, ``scripts/run-course.sh --execute``) is read without a
kernel: what a widget leaves there is its plain-text form. Three things must not be there:

* a progress bar that does not end at 100 % (the first frame of a live bar: ``0%|``);
* the text form of a widget, ``VBox(children=(HBox(...`` (an explorer leaves one line instead);
* the model loader's "Loading weights" bar.

Text is read as a terminal shows it: of the parts of a line separated by carriage returns, the last.
``python -m course check-outputs [FOLDER_OR_NOTEBOOK ...]`` runs ``check_notebook`` on each file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

__all__ = ["OutputProblem", "shown_lines", "output_texts", "check_notebook", "check_paths"]

_PERCENT = re.compile(r"(?P<pct>\d{1,3})%\|")
_WIDGET_REPR = re.compile(r"\b[A-Z]\w*\((children|value|layout|description)=")
_LOADING = re.compile(r"Loading (weights|checkpoint shards)")


@dataclass(frozen=True)
class OutputProblem:
    """One problem in one cell's outputs."""

    notebook: str
    cell: int  # index in the notebook's cells
    problem: str
    line: str

    def __str__(self) -> str:
        return f"{self.notebook}, cell {self.cell}: {self.problem}: {self.line[:120]!r}"


def shown_lines(text: str) -> list[str]:
    """The lines a terminal shows for ``text``: per line, what follows its last carriage return."""
    shown = []
    for line in text.split("\n"):
        parts = [p for p in line.split("\r") if p.strip()]
        shown.append(parts[-1] if parts else "")
    return shown


def output_texts(output: dict) -> list[str]:
    """The text a page without a kernel shows for one output: a stream's text, or a result's
    ``text/plain`` (when it has no richer form than a widget view, which needs a kernel)."""
    if output.get("output_type") == "stream":
        text = output.get("text", "")
        return ["".join(text) if isinstance(text, list) else text]
    data = output.get("data", {})
    if "text/plain" in data:
        text = data["text/plain"]
        return ["".join(text) if isinstance(text, list) else text]
    return []


def _bar_problems(lines: list[str]) -> list[tuple[str, str]]:
    """Every progress bar whose last line is below 100 %: (problem, line). Bars are told apart by
    the text before their percentage (their description)."""
    last: dict[str, tuple[int, str]] = {}
    for line in lines:
        m = _PERCENT.search(line)
        if m:
            last[line[: m.start()].strip().rstrip(":")] = (int(m.group("pct")), line)
    return [(f"progress bar stopped at {pct} %", line) for pct, line in last.values() if pct < 100]


def check_notebook(path: str | Path) -> list[OutputProblem]:
    """Problems in the outputs of one executed notebook (empty: it reads cleanly without a kernel)."""
    nb = nbformat.read(str(path), as_version=4)
    problems = []
    for index, cell in enumerate(nb.cells):
        # a cell's outputs in order, as one text: a kernel may send one bar's lines as separate outputs
        lines = [ln for output in cell.get("outputs", []) for text in output_texts(output) for ln in shown_lines(text)]
        found = _bar_problems(lines)
        found += [("widget shown as text", ln) for ln in lines if _WIDGET_REPR.search(ln)]
        found += [("model loading message", ln) for ln in lines if _LOADING.search(ln)]
        problems += [OutputProblem(str(path), index, problem, line.strip()) for problem, line in found]
    return problems


def check_paths(paths: list[str | Path]) -> tuple[list[Path], list[OutputProblem]]:
    """Check notebooks and every ``*.ipynb`` in folders: (notebooks checked, problems found)."""
    notebooks: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            notebooks += sorted(p.glob("*.ipynb"))
        elif p.suffix == ".ipynb" and p.is_file():
            notebooks.append(p)
        else:
            raise ValueError(f"paths must be executed notebooks (.ipynb) or folders holding them; got {str(p)!r}")
    if not notebooks:
        raise ValueError(f"no executed notebooks (.ipynb) in {', '.join(map(str, paths))}")
    return notebooks, [problem for nb in notebooks for problem in check_notebook(nb)]
