"""Correct solutions written independently of the course's: at least two for every code exercise.

Each file ``nbNN/<exercise>_<letter>.py`` is one student's whole exercise cell for exercise ``NN.<exercise>``:
its own imports, helpers and the function the check cell names (``h2o_step`` for ``04.h2o_decode``). They were
written from the student copy alone (notebooks/student/), not from the solution notebook or the checker, and
each pair differs in structure (loop against vectorised, another valid order or tie-break, own helpers, ...).
They live with the tests, never in the package or the notebooks.

``python -m tests.alternatives [ID ...]`` checks them in this process (quick, while writing one);
``tests/instructor/test_class_grading.py`` grades them for real, pasted into a graded release, in the sandbox,
second check included.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
STUDENT = HERE.parents[1] / "notebooks" / "student"
CHECK = re.compile(r"^(\w+) = check\(\s*\"(\d\d\.\w+)\",\s*(\w+)", re.M)


def files() -> dict[str, list[Path]]:
    """{exercise id: its alternative files, sorted}."""
    out: dict[str, list[Path]] = {}
    for path in sorted(HERE.glob("nb[0-9][0-9]/*_[a-z].py")):
        out.setdefault(f"{path.parent.name[2:]}.{path.stem[:-2]}", []).append(path)
    return out


def function_names(notebook: Path) -> dict[str, str]:
    """{exercise id: the name of the function its check cell checks} in one notebook."""
    nb = nbformat.read(notebook, as_version=4)
    return {m.group(2): m.group(3) for c in nb.cells if c.cell_type == "code" for m in CHECK.finditer(c.source)}


def student_copy(number: str) -> Path:
    [path] = STUDENT.glob(f"{number}_*.ipynb")
    return path


def load(path: Path, name: str):
    """The function ``name`` that the alternative file ``path`` defines, run as a fresh cell would run."""
    namespace: dict = {"__name__": f"alternative_{path.stem}"}
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)
    return namespace[name]


def paste(nb: nbformat.NotebookNode, sources: dict[str, str]) -> nbformat.NotebookNode:
    """``nb`` with the exercise cell (the code cell before each check cell) of every id in ``sources`` replaced."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    for i in code:
        for m in CHECK.finditer(nb.cells[i].source):
            if m.group(2) in sources:
                cell = nb.cells[max(j for j in code if j < i)]
                if f"def {m.group(3)}(" not in cell.source:
                    raise ValueError(f"{m.group(2)}: the cell before its check does not define {m.group(3)}")
                cell.source = sources[m.group(2)]
    return nb
