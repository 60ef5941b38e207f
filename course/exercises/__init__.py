"""Graded exercises: every notebook's checkers, with targeted hints, and ``check``, which each check cell calls.

In a notebook, after the exercise cell::

    my_fn = check("01.kv_cache_bytes", my_fn, autofill=AUTOFILL)

``check`` runs small deterministic cases against the reference in the package. A wrong
answer raises ``ExerciseFailed`` with a hint aimed at the likely mistake; an exercise not yet
done (``raise NotImplementedError()``) raises ``NotDoneYet``, unless ``autofill`` is on, in
which case the reference is used (with a visible warning) so the notebook still runs end to
end. Exercises are marked with nbgrader's ``### BEGIN SOLUTION`` / ``### END SOLUTION``.

Under the autograder (``python -m course grade``), ``check`` hands the function to the grader, which
runs the checker in its own process (``course.instructor.grading.remote``); see docs/grading.md. The
references and checkers live here, beside the course; the grading machinery is the instructor's
(``course.instructor``).
"""

from course.exercises.core import REGISTRY, Exercise, ExerciseFailed, NotDoneYet, Wrong, check, exercise
from course.exercises import nb01, nb02, nb03, nb04, nb05, nb06, nb07, questions  # noqa: E402,F401 (registers them)

__all__ = ["check", "exercise", "Exercise", "ExerciseFailed", "NotDoneYet", "Wrong", "REGISTRY"]
