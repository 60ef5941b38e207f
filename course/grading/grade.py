"""The autograder: ``python -m course grade PATH... [--timeout S] [--out DIR] [--json]``.

Submissions are notebooks, or folders searched recursively for ``*.ipynb``. Naming rule:

* the **student** is the file name's prefix before ``__`` when there is one
  (``alice__01_kv_cache.ipynb``), otherwise the name of the folder holding the file
  (``submissions/alice/01_kv_cache.ipynb``);
* the **notebook** is the two digits the rest of the file name starts with (``01``).

Each submission runs top to bottom in a fresh ``python3`` kernel, in a temporary working folder,
with the parameters ``FAST = True`` and ``AUTOFILL = False`` injected after its ``parameters``
cell and ``COURSE_GRADE_OUT`` set, so that every ``check(...)`` call records its result (the
checker runs the student's function inside the kernel; printed output is ignored and not even
kept). A cell that raises does not stop the run; a cell that runs longer than the per-cell
timeout is interrupted; the whole notebook also has an overall time limit. Student code runs with
the grader's permissions: grade untrusted submissions inside a container or a throwaway account.

Every registered exercise of the notebook (``course.grading.REGISTRY``, ids ``"NN.*"``) gets one
row: ``student, notebook, exercise, points, max_points, status, feedback, submission``.
``status`` is the check's own (``pass``, ``wrong``, ``error``: the function raised, ``not_done``)
or, when no check result was recorded, ``timeout`` (the check cell ran out of time),
``not_reached`` (the feedback says why), or ``error`` for a notebook that could not be run at all.
A file whose notebook number is unknown gets a single row with an empty ``exercise``.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from time import monotonic

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

import course.grading.exercises  # noqa: F401  (registers every notebook's exercises)
from course.grading.core import AUTOFILL_ENV, GRADE_OUT_ENV, REGISTRY
from course.progress import PROGRESS_ENV

__all__ = ["COLUMNS", "find_submissions", "student_and_notebook", "grade_submission", "grade", "totals",
           "write_gradebook", "format_gradebook"]

COLUMNS = ("student", "notebook", "exercise", "points", "max_points", "status", "feedback", "submission")
INJECTED_PARAMETERS = "# Parameters injected by the autograder\nFAST = True\nAUTOFILL = False\n"
TIMEOUT_ENAME = "CellTimeout"
CHECK_STATUSES = ("pass", "wrong", "error", "not_done")  # what course.grading.core.result_of returns
_LOG = logging.getLogger("course.grading.grade")  # nbclient's messages (timeouts, ...) stay off the console
_LOG.addHandler(logging.NullHandler())
_LOG.propagate = False


# ----------------------------------------------------------------------------- submissions
def find_submissions(paths: list[str | Path]) -> list[Path]:
    """The notebooks named by ``paths`` (files, or folders searched recursively), sorted, without duplicates."""
    found: set[Path] = set()
    for p in map(Path, paths):
        if p.is_dir():
            found.update(f for f in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in f.parts)
        elif p.is_file():
            found.add(p)
        else:
            raise ValueError(f"path {p} does not exist")
    if not found:
        raise ValueError(f"no notebooks (*.ipynb) found in {', '.join(map(str, paths))}")
    return sorted(found)


def student_and_notebook(path: Path) -> tuple[str, str | None]:
    """(student, notebook id or None) from a submission's path; see the module docstring for the rule."""
    prefix, sep, rest = path.name.partition("__")
    student, name = (prefix, rest) if sep else (path.resolve().parent.name, path.name)
    number = re.match(r"(\d{2})(?!\d)", name)
    return student, number.group(1) if number else None


# ----------------------------------------------------------------------------- execution
@dataclass
class _CellOutcome:
    error: str | None = None  # "NameError: name 'x' is not defined"; None when the cell ran cleanly
    timed_out_after: int | None = None  # seconds, when the cell was interrupted


@dataclass
class _Run:
    cells: dict[int, _CellOutcome] = field(default_factory=dict)  # by index in the submitted notebook
    stopped: str | None = None  # why the run ended before the last cell


class _QuietClient(NotebookClient):
    """Keeps no outputs: grades come from the check records, and a student's output may be huge."""

    def output(self, outs, msg, display_id, cell_index):
        return None


def _with_parameters(nb: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, list[int | None]]:
    """The notebook with the grading parameters injected after its ``parameters`` cell (or first), and
    for every cell its index in the submitted notebook (None for the injected one)."""
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    at = tagged[0] + 1 if tagged else 0
    origin: list[int | None] = list(range(len(nb.cells)))
    nb.cells.insert(at, nbformat.v4.new_code_cell(INJECTED_PARAMETERS))
    origin.insert(at, None)
    return nb, origin


def _describe(nb: nbformat.NotebookNode, index: int) -> str:
    """'cell 7 (`first line …`)': where a cell is, for feedback (cells counted from 1, markdown included)."""
    first = next((line.strip() for line in nb.cells[index].source.splitlines() if line.strip()), "")
    return f"cell {index + 1} (`{first[:40]}{'…' if len(first) > 40 else ''}`)"


def _execute(nb: nbformat.NotebookNode, workdir: Path, env: dict[str, str], timeout: int,
             total_timeout: int) -> _Run:
    """Run every code cell, past errors, each within ``timeout`` s and all within ``total_timeout`` s."""
    run_nb, origin = _with_parameters(nbformat.from_dict(nb))
    run = _Run()
    reply: dict[str, dict] = {}

    def on_executed(cell, cell_index, execute_reply) -> None:
        reply["content"] = (execute_reply or {}).get("content", {})

    client = _QuietClient(run_nb, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True,
                          record_timing=False, shutdown_kernel="immediate", on_cell_executed=on_executed,
                          resources={"metadata": {"path": str(workdir)}}, log=_LOG)
    deadline = monotonic() + total_timeout
    with client.setup_kernel(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        for index, cell in enumerate(run_nb.cells):
            if cell.cell_type != "code" or not cell.source.strip():
                continue
            where = "the injected parameters" if origin[index] is None else _describe(nb, origin[index])
            remaining = deadline - monotonic()
            if remaining <= 0:
                run.stopped = f"the notebook used up its overall time limit of {total_timeout} s before {where}"
                break
            limit = max(1, math.ceil(min(timeout, remaining)))
            client.timeout = limit
            client.error_on_timeout = {"ename": TIMEOUT_ENAME, "evalue": f"interrupted after {limit} s"}
            reply.clear()
            try:
                client.execute_cell(cell, index)
            except DeadKernelError:
                run.stopped = f"the kernel died in {where} (a crash, os._exit() or out of memory?)"
                break
            content = reply.get("content", {})
            outcome = _CellOutcome()
            if content.get("status") == "error":
                outcome.error = f"{content.get('ename')}: {content.get('evalue')}"
                if content.get("ename") == TIMEOUT_ENAME:
                    if limit < timeout:  # cut short by the overall limit, not by its own
                        run.stopped = f"the notebook used up its overall time limit of {total_timeout} s in {where}"
                        break
                    outcome.timed_out_after = limit
            if origin[index] is not None:
                run.cells[origin[index]] = outcome
    return run


# ----------------------------------------------------------------------------- scoring
def _row(student: str, notebook: str, exercise: str, points: int, max_points: int, status: str, feedback: str,
         submission: Path) -> dict:
    return dict(student=student, notebook=notebook, exercise=exercise, points=points, max_points=max_points,
                status=status, feedback=feedback, submission=str(submission))


def _records(path: Path, notebook: str) -> dict[str, dict]:
    """The last check record of each of this notebook's exercises (malformed records are skipped)."""
    records: dict[str, dict] = {}
    if not path.exists():
        return records
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if (isinstance(record, dict) and str(record.get("exercise", "")).startswith(f"{notebook}.")
                and record.get("status") in CHECK_STATUSES):
            records[record["exercise"]] = record
    return records


def _check_cell(nb: nbformat.NotebookNode, exercise: str) -> int | None:
    """Index of the first code cell that names the exercise (its check cell)."""
    quoted = (f'"{exercise}"', f"'{exercise}'")
    return next((i for i, c in enumerate(nb.cells)
                 if c.cell_type == "code" and any(q in c.source for q in quoted)), None)


def _why_no_record(nb: nbformat.NotebookNode, exercise: str, run: _Run) -> tuple[str, str]:
    """(status, feedback) for an exercise whose check recorded nothing."""
    check_cell = _check_cell(nb, exercise)
    if check_cell is None:
        return "not_reached", "no cell of the notebook checks this exercise (was its check cell deleted?)"
    where = _describe(nb, check_cell)
    outcome = run.cells.get(check_cell)
    if outcome is None:
        return "not_reached", f"not reached: {run.stopped or where + ' was not run'}"
    if outcome.timed_out_after is not None:
        return "timeout", f"timed out after {outcome.timed_out_after} s in {where} (an endless loop?)"
    if outcome.error is not None:
        feedback = f"not reached: {where} raised {outcome.error}"
        first = min(i for i, o in run.cells.items() if o.error is not None)
        if first < check_cell:
            feedback += f"; the first error was in {_describe(nb, first)}: {run.cells[first].error}"
        return "not_reached", feedback
    return "not_reached", f"{where} ran but recorded no check result (was the check call changed?)"


def grade_submission(path: Path, timeout: int = 300, total_timeout: int | None = None) -> list[dict]:
    """Execute one submitted notebook and return one row per exercise of its notebook.

    ``timeout``: seconds each cell may run; ``total_timeout``: seconds the whole notebook may run
    (default 6 x ``timeout``). Never raises because of the submission's content.
    """
    if timeout < 1:
        raise ValueError(f"timeout must be at least 1 second, got {timeout}")
    total_timeout = 6 * timeout if total_timeout is None else total_timeout
    if total_timeout < 1:
        raise ValueError(f"total_timeout must be at least 1 second, got {total_timeout}")
    student, notebook = student_and_notebook(path)
    exercises = [ex for ex in REGISTRY.values() if notebook and ex.id.startswith(f"{notebook}.")]
    if not exercises:
        why = (f"no exercises are registered for notebook {notebook}" if notebook else
               "the file name does not start with a notebook number (e.g. 01_kv_cache.ipynb)")
        return [_row(student, notebook or "", "", 0, 0, "error", f"cannot grade this file: {why}", path)]
    try:
        nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
        with tempfile.TemporaryDirectory(prefix="course-grade-") as tmp:
            records_path = Path(tmp) / "checks.jsonl"
            env = {**os.environ, GRADE_OUT_ENV: str(records_path), AUTOFILL_ENV: "0", "COURSE_FAST": "1",
                   PROGRESS_ENV: "off"}  # nobody watches these bars
            run = _execute(nb, Path(tmp), env, timeout, total_timeout)
            records = _records(records_path, notebook)
    except Exception as e:  # unreadable notebook or a kernel that would not start
        return [_row(student, notebook, ex.id, 0, ex.points, "error",
                     f"the notebook could not be run: {type(e).__name__}: {e}", path) for ex in exercises]
    rows = []
    for ex in exercises:
        record = records.get(ex.id)
        if record is None:
            status, feedback = _why_no_record(nb, ex.id, run)
        else:
            status, feedback = record["status"], str(record.get("feedback", ""))
        rows.append(_row(student, notebook, ex.id, ex.points if status == "pass" else 0, ex.points, status,
                         feedback, path))
    return rows


def grade(paths: list[str | Path], timeout: int = 300, total_timeout: int | None = None,
          progress: bool = False) -> list[dict]:
    """Grade every submission found under ``paths`` (see ``find_submissions``); rows in path order."""
    rows = []
    for path in find_submissions(paths):
        if progress:
            print(f"grading {path} ...", flush=True)
        rows += grade_submission(path, timeout, total_timeout)
    return rows


# ----------------------------------------------------------------------------- the gradebook
def totals(rows: list[dict]) -> list[dict]:
    """Points and maximum per student, in order of first appearance."""
    out: dict[str, dict] = {}
    for r in rows:
        t = out.setdefault(r["student"], {"student": r["student"], "points": 0, "max_points": 0})
        t["points"] += r["points"]
        t["max_points"] += r["max_points"]
    return list(out.values())


def write_gradebook(rows: list[dict], out_dir: Path) -> tuple[Path, Path]:
    """Write ``gradebook.csv`` and ``gradebook.json`` (the same rows) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / "gradebook.csv", out_dir / "gradebook.json"
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    json_path.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return csv_path, json_path


def format_gradebook(rows: list[dict]) -> str:
    """The rows as an aligned table, followed by each student's total."""
    header = ("student", "nb", "exercise", "points", "status", "feedback")
    table = [header] + [(r["student"], r["notebook"], r["exercise"] or "-", f"{r['points']}/{r['max_points']}",
                         r["status"], r["feedback"]) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in table]
    lines.append("")
    lines += [f"total {t['student']}: {t['points']}/{t['max_points']}" for t in totals(rows)]
    return "\n".join(lines)
