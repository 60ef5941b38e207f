"""Correct solutions written independently of the course's: at least two for every code exercise.

Each file ``nbNN/<exercise>_<letter>.py`` is one student's whole exercise cell for exercise ``NN.<exercise>``:
its own imports, helpers and the function the check cell names (``h2o_step`` for ``04.h2o_decode``). Those of
notebooks 01, 02, 07 and 08 were written from the student copy alone (notebooks/student/), not from the solution
notebook or the checker; those of 03 to 06 and 09 were written against the exercise texts by the course's
authors, who know the reference. Each pair differs from the reference and from each other in structure (loop
against vectorised, another valid order or tie-break, own helpers, ...).
They live with the tests, never in the package or the notebooks.

``python -m tests.alternatives [ID ...]`` checks them in this process (quick, while writing one);
``tests/exercises/test_alternatives.py`` runs every one through its checker in the test suite.
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


def written_code_by_student(number: str) -> tuple[dict[str, str], str]:
    """Notebook ``number``'s alternatives as the similarity report sees them: ``({letter: written code}, the
    course's solutions)``, each letter's files (``_a``, ``_b``, ...) one student's written code, the lines the
    released copy gives left out of both."""
    import json

    from course.instructor.grading.key import released_lines
    from course.instructor.grading.similarity import solution_lines, written_lines

    students: dict[str, list[str]] = {}
    for ex_id, paths in files().items():
        if ex_id[:2] == number:
            for path in paths:
                students.setdefault(path.stem[-1], []).append(path.read_text(encoding="utf-8"))
    released = frozenset(released_lines(nbformat.read(student_copy(number), as_version=4)))
    [solution] = (HERE.parents[1] / "notebooks").glob(f"{number}_*.ipynb")
    solutions = "\n".join(solution_lines(json.loads(solution.read_text(encoding="utf-8")), released))
    texts = {letter: "\n".join(written_lines({"cells": [{"cell_type": "code", "source": s} for s in sources]},
                                              released))
             for letter, sources in sorted(students.items())}
    return texts, solutions


def independent_similarity() -> dict[str, float]:
    """Per notebook, the highest score of these independent solutions against the course's public solutions in
    the similarity report (``course.instructor.grading.similarity.independent_scores``)."""
    from course.instructor.grading.similarity import independent_scores

    numbers = sorted({ex_id[:2] for ex_id in files()})
    return {n: round(independent_scores(n, *written_code_by_student(n)), 3) for n in numbers}
