"""The exercise registry and ``check``, the function every check cell calls."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Exercise", "Wrong", "Partial", "ExerciseFailed", "NotDoneYet", "StudentRaised", "REGISTRY", "exercise",
           "check", "result_of", "outcome"]

AUTOFILL_ENV = "COURSE_AUTOFILL"


class Wrong(AssertionError):
    """Raised by a checker: the student's function gave a wrong result. The message is the hint."""


class Partial(Wrong):
    """Raised by a grader's measurement: the function works but earns only ``points`` (the message says why)."""

    def __init__(self, message: str, points: int) -> None:
        super().__init__(message)
        self.points = points


class ExerciseFailed(AssertionError):
    """What the student sees when an exercise is wrong."""


class NotDoneYet(RuntimeError):
    """What the student sees when an exercise still raises NotImplementedError."""


class StudentRaised(Exception):
    """The student's function, run in the submission's kernel, raised (seen by the grader's checker)."""

    def __init__(self, type_name: str, message: str, where: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name, self.message, self.where = type_name, message, where


@dataclass(frozen=True)
class Exercise:
    id: str  # "<notebook>.<name>", e.g. "01.kv_cache_bytes"
    title: str
    reference: Callable
    checker: Callable[[Callable], None]  # raises Wrong(hint) on a wrong function
    points: int = 1
    # run by the autograder only, after ``checker`` passed: a measurement the notebook cannot make (hidden
    # data); raises Partial(hint, points) or Wrong(hint), returns a note for the feedback on full marks
    graded: Callable[[Callable], str | None] | None = None


REGISTRY: dict[str, Exercise] = {}


def exercise(id: str, title: str, reference: Callable, points: int = 1,
             graded: Callable[[Callable], str | None] | None = None):
    """Decorator that registers a checker for an exercise (``graded``: see ``Exercise``)."""

    def register(checker: Callable[[Callable], None]) -> Callable[[Callable], None]:
        if id in REGISTRY:
            raise ValueError(f"exercise {id!r} registered twice")
        REGISTRY[id] = Exercise(id, title, reference, checker, points, graded)
        return checker

    return register


def get(id: str) -> Exercise:
    import course.exercises  # noqa: F401  (importing the package registers every notebook's exercises)

    if id not in REGISTRY:
        raise KeyError(f"unknown exercise {id!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[id]


def result_of(ex: Exercise, fn: Callable) -> tuple[str, str]:
    """Run an exercise's checker on ``fn``: ("pass" | "not_done" | "wrong" | "error", feedback)."""
    status, feedback, _ = outcome(ex, fn)
    return status, feedback


def outcome(ex: Exercise, fn: Callable, graded: bool = False) -> tuple[str, str, int]:
    """(status, feedback, points) of ``fn``: ``result_of``'s, and with ``graded`` (the autograder) the
    exercise's ``graded`` measurement too, which may give "partial" with fewer points."""
    note = None
    try:
        ex.checker(fn)
        if graded and ex.graded is not None:
            note = ex.graded(fn)
    except NotImplementedError:
        return "not_done", "not attempted (the function still raises NotImplementedError)", 0
    except Partial as e:
        return ("partial", str(e), max(0, min(ex.points, e.points))) if e.points > 0 else ("wrong", str(e), 0)
    except Wrong as e:
        return "wrong", str(e), 0
    except StudentRaised as e:
        return "error", f"your function raised {e.type_name}: {e.message} {e.where}".strip(), 0
    except Exception as e:  # the student's code crashed
        frames = traceback.extract_tb(e.__traceback__)
        where = next((f"line {f.lineno}" for f in reversed(frames) if "course" not in f.filename), "")
        return "error", f"your function raised {type(e).__name__}: {e} {where}".strip(), 0
    return "pass", f"correct; {note}" if note else "correct", ex.points


def _autofill_from_env() -> bool:
    return os.environ.get(AUTOFILL_ENV, "0") == "1"


def check(id: str, fn: Callable, autofill: bool = False, answers: str = "shown") -> Callable:
    """Check a student's function for exercise ``id``; return the function to use from now on.

    An exercise not done yet raises ``NotDoneYet``, unless ``autofill`` (the notebook's AUTOFILL
    parameter) is true or ``COURSE_AUTOFILL=1`` is set: then the reference is returned.

    In a kernel started by the autograder, the grader checks ``fn`` from its own process (this kernel
    only answers its calls, see ``course.instructor.grading.worker``); the notebook then carries on, silently,
    with ``fn`` when a local run of the checker passes and with the reference otherwise.

    ``answers="hidden"`` (written by ``python -m course release --hide-answers`` into the questions' check cells):
    a question's check says only whether the answer is well-formed; the grader decides whether it is right.
    """
    if answers not in ("shown", "hidden"):
        raise ValueError(f"answers must be 'shown' or 'hidden', got {answers!r}")
    from course.instructor.grading import worker

    ex = get(id)
    if worker.grading():
        worker.serve(id, fn, ex.reference)
        return fn if result_of(ex, fn)[0] == "pass" else ex.reference
    if not isinstance(autofill, bool):  # bool("False") is True: a string must not switch it on
        raise TypeError(f"autofill must be True or False, got {autofill!r} ({type(autofill).__name__})")
    autofill = autofill or _autofill_from_env()
    if answers == "hidden" and ".q_" in id:
        return _check_form_only(ex, fn, autofill)
    status, feedback = result_of(ex, fn)
    if status == "pass":
        print(f"✓ {ex.title}: correct.")
        return fn
    if status == "not_done":
        if autofill:
            print(f"⚠ {ex.title}: not done yet, AUTOFILL is on, so the reference solution is used from here on.")
            return ex.reference
        raise NotDoneYet(f"{ex.title} is not done yet: replace `raise NotImplementedError()` with your code "
                         "(or set AUTOFILL = True in the parameters cell to run on with the reference).")
    raise ExerciseFailed(f"✗ {ex.title}: {feedback}")


def _check_form_only(ex: Exercise, fn: Callable, autofill: bool) -> Callable:
    """A question's check with hidden answers: well-formed or not, never right or wrong."""
    from course.exercises.questions import check_form

    try:
        check_form(ex.id, fn)
    except NotImplementedError:
        if autofill:
            print(f"⚠ {ex.title}: not answered yet, AUTOFILL is on.")
            return fn
        raise NotDoneYet(f"{ex.title} is not answered yet: replace `raise NotImplementedError()` with your answer "
                         "(or set AUTOFILL = True in the parameters cell to run on).") from None
    except Wrong as e:
        raise ExerciseFailed(f"✗ {ex.title}: {e}") from None
    print(f"✓ {ex.title}: answer recorded (well-formed); the grader decides whether it is right.")
    return fn
