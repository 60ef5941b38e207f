"""A look at the submitted source, from the grader's process: lines that reach into the grader.

A student's notebook has no reason to import the course's reference implementations or the grading
machinery, or to install profile/trace hooks (which could blind the worker's watch for calls into the
reference). Such lines do not change what the checker measures; they put the submission's passing
exercises up for review (no points until the instructor looks).
"""

from __future__ import annotations

import re

import nbformat

__all__ = ["grader_internals"]

_PATTERNS = [
    re.compile(r"course\.exercises\.(?!check\b)\w+"),  # course.exercises.core, .nb01, ...
    re.compile(r"course\.instructor\b"),  # the grader, its worker, release, ...
    re.compile(r"from\s+course\.exercises\s+import\s+(?![\s(]*check\s*[)]?\s*(#.*)?$).*"),  # anything but `check`
    re.compile(r"\bREGISTRY\b|\bsetprofile\b|\bsettrace\b|\bCOURSE_GRADER_\w*|\b__import__\b|\bimportlib\b"),
]


def grader_internals(nb: nbformat.NotebookNode) -> list[str]:
    """'cell 4, line 2: `...`' for every code line that reaches into the grader (empty when none)."""
    found = []
    for number, cell in enumerate(nb.cells, start=1):
        if cell.get("cell_type") != "code":
            continue
        for line_number, line in enumerate(str(cell.get("source", "")).splitlines(), start=1):
            if any(p.search(line) for p in _PATTERNS):
                text = line.strip()
                found.append(f"cell {number}, line {line_number}: `{text[:60]}{'…' if len(text) > 60 else ''}`")
    return found
