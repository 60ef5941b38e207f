"""How long each notebook takes to run top to bottom, quiet and next to a competing process.

``python -m course bench --notebooks [--fast] [--competing]`` executes every notebook with
papermill as ``scripts/run-course.sh --execute`` does (plain-text progress, ``FAST`` passed as a
parameter), one after the other, and writes a markdown table of wall times. With ``--competing``
each notebook runs a second time next to one CPU-bound process (``course.threads.competing_process``),
which is what a laptop busy with something else, or a shared machine, looks like.
"""

from __future__ import annotations

import os
import platform
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from pathlib import Path

from course import syllabus
from course.threads import competing_process, cpu_cores

__all__ = ["execute_notebook", "time_notebooks", "times_table", "read_times", "budget_verdict", "write_times",
           "check_mergeable", "fast_budget_s", "format_minutes"]


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Set environment variables (inherited by the kernels started inside the block), then restore them."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def execute_notebook(path: Path, out: Path, fast: bool, timeout: int | None = None,
                     env: dict[str, str] | None = None) -> float:
    """Execute one notebook with papermill into ``out`` (run from the notebook's folder, plain-text
    progress; ``FAST`` and ``COURSE_FAST`` set when ``fast``; ``env``: more variables for its kernel, e.g.
    ``COURSE_SPLIT``). Returns the wall time in seconds."""
    import papermill

    env = {"COURSE_PROGRESS": "text", "COURSE_FAST": "1" if fast else "0", **(env or {})}
    params = {"FAST": fast}  # explicit both ways: a notebook's default, "auto", is small on a CPU
    start = time.perf_counter()
    with _environment(**env):
        papermill.execute_notebook(str(path), str(out), parameters=params, cwd=str(path.parent),
                                   log_output=False, progress_bar=False, execution_timeout=timeout)
    return time.perf_counter() - start


def time_notebooks(paths: Sequence[Path], out_dir: Path, fast: bool, competing: bool,
                   timeout: int | None = None, verbose: bool = True) -> list[dict]:
    """Wall time of every notebook (one row each: "notebook", "quiet_s" and, with ``competing``,
    "competing_s"); the executed copies go to ``out_dir`` (``*.competing.ipynb`` for the second run)."""
    if not paths:
        raise ValueError("paths must name at least one notebook")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in paths:
        row = {"notebook": path.stem}
        runs = [("quiet_s", nullcontext(), path.name)]
        if competing:
            runs.append(("competing_s", competing_process(), f"{path.stem}.competing.ipynb"))
        for key, context, name in runs:
            with context:
                row[key] = execute_notebook(path, out_dir / name, fast, timeout)
            if verbose:
                print(f"{path.name} ({key[:-2]}): {row[key]:.0f} s", flush=True)
        rows.append(row)
    return rows


def format_minutes(seconds: float) -> str:
    """``75`` -> ``"1 min 15 s"``: how the tables write a wall time."""
    return f"{int(seconds // 60)} min {seconds % 60:02.0f} s"


def times_table(rows: list[dict]) -> str:
    """The rows as a markdown table, with a total line."""
    competing = all("competing_s" in r for r in rows)
    head = "| notebook | quiet | next to a CPU-bound process |" if competing else "| notebook | wall time |"
    lines = [head, "|---|---|---|" if competing else "|---|---|"]
    keys = ["quiet_s"] + (["competing_s"] if competing else [])
    for r in rows:
        lines.append(f"| {r['notebook']} | " + " | ".join(format_minutes(r[k]) for k in keys) + " |")
    lines.append("| **all** | " + " | ".join(f"**{format_minutes(sum(r[k] for r in rows))}**" for k in keys) + " |")
    return "\n".join(lines)


_ROW = re.compile(r"^\| (\d\d_\w+) \| (\d+) min (\d+) s \|", re.M)
SECTIONS = {True: "## FAST", False: "## Full size"}  # write_times keeps one table per mode


def _section(text: str, fast: bool) -> str:
    """The part of ``text`` under the mode's heading (the whole text for a file written before the headings)."""
    head = SECTIONS[fast]
    if head not in text:
        return text if fast and SECTIONS[False] not in text else ""
    part = text.split(head, 1)[1]
    return part.split("\n## ", 1)[0]


def _quiet_rows(path: Path, fast: bool) -> list[tuple[str, int]]:
    """(notebook, quiet seconds) of the mode's table in ``path``."""
    return [(name, 60 * int(m) + int(s)) for name, m, s in _ROW.findall(_section(path.read_text(), fast))]


def read_times(path: Path, fast: bool = True) -> dict[str, float]:
    """The first column of the mode's table written by ``write_times`` (quiet wall time, seconds), by notebook."""
    found = dict(_quiet_rows(path, fast))
    if not found:
        mode = "FAST" if fast else "full-size"
        raise ValueError(f"{path} has no {mode} table of notebook times (write it with `python -m course bench "
                         f"--notebooks{' --fast' if fast else ''}`)")
    return found


# FAST: at most 3 min per notebook (unless its row in course.syllabus says otherwise) and 15 min for all of them
FAST_BUDGET_S = {"notebook": syllabus.FAST_BUDGET_S, "all": syllabus.FAST_BUDGET_ALL_S}


def fast_budget_s(name: str) -> int:
    """The FAST budget of the notebook ``name`` (its row in ``course.syllabus``; the usual one for a notebook the
    course does not list)."""
    return next((nb.fast_budget_s for nb in syllabus.notebooks() if nb.name == name), FAST_BUDGET_S["notebook"])


def budget_verdict(rows: list[dict]) -> str:
    """One line: does every column meet the FAST budget (3 min per notebook, 15 min in all)? Names what does not."""
    keys = [k for k in ("quiet_s", "competing_s") if all(k in r for r in rows)]
    over = [f"{r['notebook']} ({k[:-2]}, {format_minutes(r[k])})" for k in keys for r in rows
            if r[k] > fast_budget_s(r["notebook"])]
    over += [f"all ({k[:-2]}, {format_minutes(sum(r[k] for r in rows))})" for k in keys
             if sum(r[k] for r in rows) > FAST_BUDGET_S["all"]]
    budget = f"{FAST_BUDGET_S['notebook'] // 60} min per notebook, {FAST_BUDGET_S['all'] // 60} min in all"
    return f"FAST budget ({budget}): " + ("met in every column." if not over else "over in " + "; ".join(over) + ".")


def check_mergeable(path: Path, fast: bool, competing: bool, now: set[str]) -> None:
    """Refuse a competing run of some notebooks (``now``, stems) where the mode's table in ``path`` holds other
    notebooks, whose earlier rows have no competing column; called before any notebook runs."""
    if competing and path.exists() and any(name not in now for name, _ in _quiet_rows(path, fast)):
        raise ValueError(f"{path} has earlier times without a competing column: time every notebook again "
                         "with --competing, or these without it")


def _merged(rows: list[dict], path: Path, fast: bool) -> list[dict]:
    """The rows measured now, plus the mode's earlier rows of notebooks not run now (``--only``: a full-size run
    of every notebook takes hours on a CPU, so it may be measured a few notebooks at a time)."""
    if not path.exists():
        return rows
    now = {r["notebook"] for r in rows}
    check_mergeable(path, fast, any("competing_s" in r for r in rows), now)
    earlier = [{"notebook": name, "quiet_s": float(s)} for name, s in _quiet_rows(path, fast) if name not in now]
    return sorted(rows + earlier, key=lambda r: r["notebook"])


def write_times(rows: list[dict], path: Path, fast: bool, threads_note: str = "",
                notebooks: Sequence[str] = ()) -> Path:
    """Write the mode's table, with the machine it was measured on, to ``path`` (markdown); the other mode's
    table in the file is kept. The rows are merged with the mode's earlier ones (``_merged``); the ``notebooks``
    (stems) that still have no time are named."""
    import torch

    rows = _merged(rows, path, fast)
    mode = "FAST (`--fast`)" if fast else "full size (FAST = False)"
    flags = f"{' --fast' if fast else ''}{' --competing' if all('competing_s' in r for r in rows) else ''}"
    missing = sorted(set(notebooks) - {r["notebook"] for r in rows})
    section = (
        f"{SECTIONS[fast]}\n\n"
        f"Measured by `python -m course bench --notebooks{flags}`: every notebook executed top to bottom with "
        f"papermill, {mode}, one after the other"
        + ("; \"next to a CPU-bound process\" runs it again while one Python busy loop takes a core.\n\n"
           if "--competing" in flags else ".\n\n")
        + f"Machine: {platform.machine()}, {cpu_cores()} cores, torch {torch.__version__}, "
        f"{datetime.now(timezone.utc):%Y-%m-%d}.{(' ' + threads_note) if threads_note else ''}\n\n"
        + times_table(rows) + "\n"
        + (f"\n{budget_verdict(rows)}\n" if fast else "")
        + (f"\nNot timed {'in FAST' if fast else 'at full size'} on this machine yet: {', '.join(missing)}.\n"
           if missing else "")
    )
    other = _section(path.read_text(), not fast).strip() if path.exists() else ""
    sections = {fast: section, not fast: f"{SECTIONS[not fast]}\n\n{other}\n" if other else ""}
    text = "# Notebook wall times\n\n" + "\n".join(sections[m] for m in (True, False) if sections[m])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
