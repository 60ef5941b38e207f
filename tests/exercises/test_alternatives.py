"""Correct solutions written differently from the course's (tests/alternatives): each passes its exercise's
checker with full points, in this process, as the grader's checker would see it."""

from __future__ import annotations

import pytest

from course.exercises.checking import get
from course.exercises.core import outcome
from tests import alternatives

CASES = [(ex_id, path) for ex_id, paths in sorted(alternatives.files().items()) for path in paths]


@pytest.mark.parametrize("ex_id, path", CASES, ids=[f"{e}-{p.stem}" for e, p in CASES])
def test_a_correct_solution_written_differently_passes(ex_id, path):
    name = alternatives.function_names(alternatives.student_copy(ex_id[:2]))[ex_id]
    status, feedback, points = outcome(get(ex_id), alternatives.load(path, name))
    assert (status, points) == ("pass", get(ex_id).points), feedback


def test_every_exercise_with_alternatives_has_at_least_two():
    counts = {ex_id: len(paths) for ex_id, paths in alternatives.files().items()}
    assert counts and all(n >= 2 for n in counts.values()), counts
