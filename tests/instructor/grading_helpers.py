"""Submissions for the grading tests: copies of a real notebook, trimmed to its exercises, or tiny notebooks that
check one exercise (fast to run); and the processes a test run left behind."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def exercises_only(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook without its demonstrations (fast to run): the setup cells, then each check cell and
    the exercise cell before it."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    checks = [i for i in code if "= check(" in nb.cells[i].source]
    setup_end = next(i for i in code if "import check" in nb.cells[i].source)
    keep = {i for i in code if i <= setup_end} | set(checks) | {max(j for j in code if j < i) for i in checks}
    nb.cells = [c for i, c in enumerate(nb.cells) if i in keep]
    return nb


def submission(folder: Path, source: Path, replace: dict[str, str] | None = None, trim: bool = True,
               extra_cell: str | None = None, first_cell: str | None = None) -> Path:
    """A copy of ``source`` in ``folder`` (the student's name): cells defining ``def NAME`` replaced,
    ``first_cell`` inserted after the cell importing ``check`` and ``extra_cell`` appended."""
    nb = nbformat.read(source, as_version=4)
    for name, code in (replace or {}).items():
        cell = next(c for c in nb.cells if c.cell_type == "code" and f"def {name}(" in c.source)
        cell.source = code
    if trim:
        nb = exercises_only(nb)
    if first_cell:
        setup = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "import check" in c.source)
        nb.cells.insert(setup + 1, nbformat.v4.new_code_cell(first_cell))
    if extra_cell:
        nb.cells.append(nbformat.v4.new_code_cell(extra_cell))
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / source.name)
    return folder / source.name




GOOD = ("def kv_cache_bytes(n_layers, kv_heads, head_dim, tokens, batch=1, dtype_bytes=2):\n"
        "    return 2 * n_layers * kv_heads * head_dim * tokens * batch * dtype_bytes\n")
CHECK = 'kv_cache_bytes = check("01.kv_cache_bytes", kv_cache_bytes, autofill=AUTOFILL)'


def tiny(path: Path, *cells: str) -> Path:
    """A small notebook 01: imports ``check``, then ``cells``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c)
                                         for c in ("from course.exercises import check", *cells)])
    nbformat.write(nb, path)
    return path


def marked_processes(mark: str, where: tuple[str, ...] = ("environ",)) -> list[int]:
    """Processes whose environment (or, with ``where``, command line) holds ``mark`` (a test gives its grader a
    unique variable; a sandboxed kernel, whose environment is an allow-list, is found by its command line)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        for part in where:
            try:
                if mark.encode() in (proc / part).read_bytes():
                    found.append(int(proc.name))
                    break
            except OSError:
                continue
    return found


def wait_for(grader: Popen, ready: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll until ``ready()``; fail the test, killing ``grader`` and showing its output, if it ends first or
    ``seconds`` pass (``what``: what was awaited)."""
    deadline = time.monotonic() + seconds
    while not ready():
        if grader.poll() is not None or time.monotonic() > deadline:
            grader.kill()
            pytest.fail(f"the grader ended, or {seconds:g} s passed, before {what}: {grader.communicate()}")
        time.sleep(0.2)
