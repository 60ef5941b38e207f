"""The points of the course, per notebook and kind of exercise, as docs/grading.md prints them."""

from __future__ import annotations

import course.exercises  # noqa: F401  (registers every exercise)
from course.exercises.core import REGISTRY

__all__ = ["points_by_notebook", "points_table"]

COLUMNS = (("exercise", "exercises"), ("build", "build"), ("question", "questions"), ("capstone", "capstone"),
           ("writing", "writing"))


def points_by_notebook() -> dict[str, dict[str, int]]:
    """{notebook number: {kind: points}} over the exercise registry."""
    out: dict[str, dict[str, int]] = {}
    for ex in REGISTRY.values():
        row = out.setdefault(ex.id[:2], {kind: 0 for kind, _ in COLUMNS})
        row[ex.kind] += ex.points
    return dict(sorted(out.items()))


def points_table() -> str:
    """The markdown table of points per notebook and kind, with the totals."""
    rows = points_by_notebook()
    total = {kind: sum(r[kind] for r in rows.values()) for kind, _ in COLUMNS}
    lines = ["| notebook | " + " | ".join(title for _, title in COLUMNS) + " | total |",
             "|---" * (len(COLUMNS) + 2) + "|"]
    for name, row in [*rows.items(), ("all", total)]:
        lines.append(f"| {name} | " + " | ".join(str(row[k]) for k, _ in COLUMNS) + f" | {sum(row.values())} |")
    return "\n".join(lines)
