"""The exercise registry and ``check``, the function every check cell calls.

An exercise is checked by *behaviour*: its checker calls the student's function on small cases and compares
what comes back with the course's public mechanisms (the cache, the policies, the models), never with a copy
of the solution. The solutions live in the solution notebooks only, and what graded work needs beyond the
mechanisms (the questions' answers, the capstone's held-out passages) travels in the instructor's key
(``python -m course release`` writes it, ``python -m course grade --key`` reads it).

Each exercise also names its *shortcuts*: the course's own implementation of what the student is asked to
build (``course.policies.SnapKV`` for the SnapKV build, ...). A function that calls one while it is checked
is reported as such, with 0 points, whatever it returns.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from course.exercises.shortcuts import Watched

__all__ = ["Exercise", "Wrong", "Partial", "ExerciseFailed", "NotDoneYet", "StudentRaised", "REGISTRY", "exercise",
           "check", "result_of", "outcome", "KINDS", "get"]

AUTOFILL_ENV = "COURSE_AUTOFILL"
KINDS = ("exercise", "build", "question", "capstone", "writing")


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
    """One graded exercise.

    checker:   raises ``Wrong(hint)`` on a wrong function; compares with the course's mechanisms only;
    fallback:  what AUTOFILL runs in place of an exercise not done yet, built on the course's mechanisms (None:
               the notebook does not need the function later);
    shortcuts: course functions and classes whose use by the student's function is refused (what the exercise
               asks to build);
    kind:      "exercise", "build" (a mechanism written from scratch), "question", "capstone" or "writing" (text,
               checked for presence and length only).
    """

    id: str  # "<notebook>.<name>", e.g. "01.kv_cache_bytes"
    title: str
    checker: Callable[[Callable], None]
    points: int = 1
    fallback: Callable | None = None
    shortcuts: tuple[Any, ...] = ()
    kind: str = "exercise"


REGISTRY: dict[str, Exercise] = {}


def exercise(id: str, title: str, points: int = 1, fallback: Callable | None = None, shortcuts: tuple = (),
             kind: str = "exercise"):
    """Decorator that registers a checker for an exercise (see ``Exercise``)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")

    def register(checker: Callable[[Callable], None]) -> Callable[[Callable], None]:
        if id in REGISTRY:
            raise ValueError(f"exercise {id!r} registered twice")
        REGISTRY[id] = Exercise(id, title, checker, points, fallback, tuple(shortcuts), kind)
        return checker

    return register


def get(id: str) -> Exercise:
    import course.exercises  # noqa: F401  (importing the package registers every notebook's exercises)

    if id not in REGISTRY:
        raise KeyError(f"unknown exercise {id!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[id]


def result_of(ex: Exercise, fn: Callable) -> tuple[str, str]:
    """Run an exercise's checker on ``fn``: ("pass" | "not_done" | "wrong" | "error" | "forwarded", feedback)."""
    status, feedback, _ = outcome(ex, fn)
    return status, feedback


def shortcut_feedback(name: str) -> str:
    return (f"your function uses {name}, the course's own implementation of what this exercise asks you to write: "
            "write it yourself (0 points, whatever it returns)")


def outcome(ex: Exercise, fn: Callable, measure: Callable[[Callable], str | None] | None = None
            ) -> tuple[str, str, int]:
    """(status, feedback, points) of ``fn``. ``measure`` (the autograder's, run after the checker passed) may
    give "partial" with fewer points, or add a note to the feedback.

    ``fn`` is watched for the exercise's shortcuts while it runs; a function that already watches itself (the
    grader's stand-in for a function served by a kernel) reports them through its own ``reached``."""
    watched = fn if hasattr(fn, "reached") else Watched(fn, ex.shortcuts)
    status, feedback, points = _judge(ex, watched, measure)
    if watched.reached:
        return "forwarded", shortcut_feedback(watched.reached), 0
    return status, feedback, points


def _judge(ex: Exercise, fn: Callable, measure: Callable[[Callable], str | None] | None) -> tuple[str, str, int]:
    note = None
    try:
        ex.checker(fn)
        if measure is not None:
            note = measure(fn)
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


def _carry_on_with(ex: Exercise, fn: Callable) -> Callable:
    """What the notebook runs on with after an exercise that is not right: the fallback, else the function."""
    return ex.fallback if ex.fallback is not None else fn


def check(id: str, fn: Callable, autofill: bool = False, answers: str = "shown", key: str | None = None) -> Callable:
    """Check a student's function for exercise ``id``; return the function to use from now on.

    An exercise not done yet raises ``NotDoneYet``, unless ``autofill`` (the notebook's AUTOFILL parameter) is
    true or ``COURSE_AUTOFILL=1`` is set: then the exercise's fallback (built on the course's mechanisms) is
    returned, so that the notebook runs on.

    In a kernel started by the autograder, the grader checks ``fn`` from its own process (this kernel only
    answers its calls, see ``course.exercises.serve``); the notebook then carries on, silently, with ``fn`` when a
    local run of the checker passes and with the fallback otherwise.

    Questions: ``key`` is the answer and its hints as ``python -m course release`` wrote them into the check cell
    (answers shown); ``answers="hidden"`` (``release --hide-answers``) says only whether an answer is well-formed.
    """
    if answers not in ("shown", "hidden"):
        raise ValueError(f"answers must be 'shown' or 'hidden', got {answers!r}")
    from course.exercises import serve

    ex = get(id)
    if serve.grading():
        serve.serve(id, fn, ex.shortcuts)
        return fn if result_of(ex, fn)[0] == "pass" else _carry_on_with(ex, fn)
    if not isinstance(autofill, bool):  # bool("False") is True: a string must not switch it on
        raise TypeError(f"autofill must be True or False, got {autofill!r} ({type(autofill).__name__})")
    autofill = autofill or _autofill_from_env()
    if ex.kind == "question":
        from course.exercises.questions import check_question

        return check_question(ex, fn, autofill, key if answers == "shown" else None)
    status, feedback = result_of(ex, fn)
    if status == "pass":
        print(f"✓ {ex.title}: correct.")
        return fn
    if status == "not_done":
        if autofill:
            if ex.fallback is None:
                print(f"⚠ {ex.title}: not done yet, AUTOFILL is on; the notebook does not need it later.")
                return fn
            print(f"⚠ {ex.title}: not done yet, AUTOFILL is on, so the course's own implementation is used from here "
                  "on.")
            return ex.fallback
        raise NotDoneYet(f"{ex.title} is not done yet: replace `raise NotImplementedError()` with your code "
                         "(or set AUTOFILL = True in the parameters cell to run on with the course's implementation).")
    raise ExerciseFailed(f"✗ {ex.title}: {feedback}")
