"""Graded exercises: every notebook's checkers, with targeted hints, and ``check``, which each check cell calls.

In a notebook, after the exercise cell::

    my_fn = check("01.kv_cache_bytes", my_fn, autofill=AUTOFILL)

``check`` runs small deterministic cases and compares what the function returns with the course's own
mechanisms (the cache, the policies, the models). A wrong answer raises ``ExerciseFailed`` with a hint aimed at
the likely mistake (for a build exercise, the hint in the notebook that matches it); an exercise not yet done
(``raise NotImplementedError()``) raises ``NotDoneYet``, unless ``autofill`` is on, in which case the course's own
implementation is used (with a visible warning) so the notebook still runs end to end. Exercises are marked with
nbgrader's ``### BEGIN SOLUTION`` / ``### END SOLUTION``; the solutions are in the solution notebooks only.

Under the autograder (``python -m course grade``), ``check`` hands the function to the grader, which runs the
checker in its own process (``course.exercises.serve`` is this side of it); see docs/grading.md.
"""

from course.exercises.checking import check  # importing it registers every notebook's exercises
from course.exercises.core import REGISTRY, Exercise, ExerciseFailed, NotDoneYet, Wrong, exercise

__all__ = ["check", "exercise", "Exercise", "ExerciseFailed", "NotDoneYet", "Wrong", "REGISTRY"]
