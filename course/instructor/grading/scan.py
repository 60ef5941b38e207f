"""A look at the submitted source, from the grader's process: lines a student wrote that reach into the grader.

A student's notebook has no reason to import the grading machinery, to read the exercise registry, or to install
profile/trace hooks (which could blind the kernel's watch for calls into the course's own implementations). Such
lines do not change what the checker measures; they put the submission's passing exercises up for review (no
points until the instructor looks).

Only what the student wrote or changed is judged: a line that the released copy already holds (the grading key
keeps a fingerprint of every line of it) is the course's, never the student's, whatever it imports.
"""

from __future__ import annotations

import re

import nbformat

from course.instructor.grading.key import line_fingerprint

__all__ = ["grader_internals"]

_PATTERNS = [
    re.compile(r"course\.exercises\.(?!check\b)\w+"),  # course.exercises.core, .serve, .nb01, ...
    re.compile(r"course\.instructor\b"),  # the grader, release, the key, ...
    re.compile(r"from\s+course\.exercises\s+import\s+(?![\s(]*check\s*[)]?\s*(#.*)?$).*"),  # anything but `check`
    re.compile(r"\bREGISTRY\b|\bsetprofile\b|\bsettrace\b|\bCOURSE_GRADER_\w*|\b__import__\b|\bimportlib\b"),
]


def grader_internals(nb: nbformat.NotebookNode, released: frozenset[str] = frozenset()) -> list[str]:
    """'cell 4, line 2: `...`' for every code line the student wrote (its fingerprint is not in ``released``) that
    reaches into the grader; empty when none."""
    found = []
    for number, cell in enumerate(nb.cells, start=1):
        if cell.get("cell_type") != "code":
            continue
        for line_number, line in enumerate(str(cell.get("source", "")).splitlines(), start=1):
            if any(p.search(line) for p in _PATTERNS) and line_fingerprint(line) not in released:
                text = line.strip()
                found.append(f"cell {number}, line {line_number}: `{text[:60]}{'…' if len(text) > 60 else ''}`")
    return found
