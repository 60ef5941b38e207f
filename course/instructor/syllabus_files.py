"""The course's own files that follow ``course.syllabus``: the README's table of notebooks, which
``python -m course release`` writes, and the solution notebooks, one per row, which ``release --check`` checks.
The table's FAST column is docs/notebook-times.md's (``python -m course bench --notebooks --fast`` rewrites it).

Both apply to the course's repository only: a folder of solution notebooks whose parent holds a README with a
table of notebooks (``| notebook | teaches |``). Release run on any other folder releases what is in it.
"""

from __future__ import annotations

from pathlib import Path

from course import syllabus

__all__ = ["course_readme", "fast_times", "fresh_readme", "write_readme_table", "syllabus_problems"]

HEADER = "| notebook | teaches |"


def course_readme(solution_dir: Path) -> Path | None:
    """The README beside ``solution_dir`` when it holds the table of notebooks (the course's repository), else None."""
    readme = solution_dir.resolve().parent / "README.md"
    return readme if readme.is_file() and HEADER in readme.read_text(encoding="utf-8") else None


def fast_times(root: Path) -> dict[str, str] | None:
    """Each notebook's FAST wall time ("1 min 03 s") from ``root``/docs/notebook-times.md; None without that file."""
    from course.instructor.notebook_times import format_minutes, read_times

    path = root / "docs" / "notebook-times.md"
    if not path.is_file():
        return None
    return {name: format_minutes(seconds) for name, seconds in read_times(path, fast=True).items()}


def fresh_readme(readme: Path) -> str:
    """The text of ``readme`` with the syllabus's table of notebooks and the measured FAST times."""
    return syllabus.with_readme_table(readme.read_text(encoding="utf-8"), fast_times(readme.parent))


def write_readme_table(solution_dir: Path) -> Path | None:
    """Write the syllabus's table into the course's README when it differs; return the README when written."""
    readme = course_readme(solution_dir)
    if readme is None:
        return None
    text = readme.read_text(encoding="utf-8")
    fresh = fresh_readme(readme)
    if fresh == text:
        return None
    readme.write_text(fresh, encoding="utf-8")
    return readme


def syllabus_problems(solution_dir: Path, pattern: str) -> list[tuple[Path, str]]:
    """In the course's repository: (path, problem) for a README table that is not the syllabus's, a solution
    notebook (``pattern``) without a row in ``course.syllabus`` and a row without its notebook. [] elsewhere."""
    readme = course_readme(solution_dir)
    if readme is None:
        return []
    text = readme.read_text(encoding="utf-8")
    problems = [] if fresh_readme(readme) == text else [(readme, "table of notebooks differs")]
    listed = {nb.file for nb in syllabus.notebooks()}
    on_disk = {p.name for p in solution_dir.glob(pattern)}
    problems += [(solution_dir / name, "not in course.syllabus") for name in sorted(on_disk - listed)]
    problems += [(solution_dir / name, "in course.syllabus, missing") for name in sorted(listed - on_disk)]
    return problems
