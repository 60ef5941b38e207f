"""The exercise registry and how a checker's verdict is reached (``check``, which every check cell calls, is in
``course.exercises.checking``).

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

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from course.exercises.shortcuts import Watched

__all__ = ["Exercise", "Wrong", "Partial", "ExerciseFailed", "NotDoneYet", "StudentRaised", "REGISTRY", "exercise",
           "result_of", "outcome", "KINDS"]

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
