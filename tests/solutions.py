"""The exercises' solutions, read from the solution notebooks (the package holds none): ``solution(id)``."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from course.instructor.release import load_answer_key
from course.instructor.solutions import solution_functions

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NUMBERS = sorted(p.name[:2] for p in NOTEBOOKS.glob("[0-9]*.ipynb"))  # every solution notebook, "01" ...


@lru_cache(maxsize=1)
def solutions() -> dict[str, Callable]:
    """{exercise id: the solution notebook's function}, every notebook."""
    out: dict[str, Callable] = {}
    for path in sorted(NOTEBOOKS.glob("[0-9]*.ipynb")):
        out.update(solution_functions(path))
    return out


def solution(exercise_id: str) -> Callable:
    return solutions()[exercise_id]


@lru_cache(maxsize=1)
def answer_key() -> dict:
    """{question id: its ``QuestionKey``} from the answer key beside the solution notebooks."""
    return load_answer_key(NOTEBOOKS)
