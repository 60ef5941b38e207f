"""The points of the course, per notebook and kind of exercise, as docs/grading.md prints them: one row per
notebook of ``course.syllabus``, in its order."""

from __future__ import annotations

from course import syllabus
from course.exercises.checking import register_all
from course.exercises.core import REGISTRY

__all__ = ["points_by_notebook", "points_table"]

COLUMNS = (("exercise", "exercises"), ("build", "build"), ("question", "questions"), ("capstone", "capstone"),
           ("writing", "writing"))


def points_by_notebook() -> dict[str, dict[str, int]]:
    """{notebook number: {kind: points}} over the exercise registry, for every notebook of the syllabus."""
    register_all()
    out = {nb.number: {kind: 0 for kind, _ in COLUMNS} for nb in syllabus.notebooks()}
    for ex in REGISTRY.values():
        if ex.id[:2] not in out:
            raise ValueError(f"exercise {ex.id} belongs to no notebook of course.syllabus ({', '.join(out)})")
        out[ex.id[:2]][ex.kind] += ex.points
    return out


def points_table() -> str:
    """The markdown table of points per notebook and kind, with the totals."""
    rows = points_by_notebook()
    total = {kind: sum(r[kind] for r in rows.values()) for kind, _ in COLUMNS}
    lines = ["| notebook | " + " | ".join(title for _, title in COLUMNS) + " | total |",
             "|---" * (len(COLUMNS) + 2) + "|"]
    for name, row in [*rows.items(), ("all", total)]:
        lines.append(f"| {name} | " + " | ".join(str(row[k]) for k, _ in COLUMNS) + f" | {sum(row.values())} |")
    return "\n".join(lines)
