"""``check``, the function every check cell calls, and ``get``, an exercise by its id.

Importing this module registers every notebook's exercises (the modules ``course.syllabus`` names, and
``questions``): ``check`` and ``get`` then find any of them.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from course import syllabus
from course.exercises import serve
from course.exercises.core import AUTOFILL_ENV, REGISTRY, Exercise, ExerciseFailed, NotDoneYet, result_of

__all__ = ["check", "get", "register_all"]


def register_all() -> None:
    """Import every notebook's exercise module (``course.syllabus``), then the questions of every notebook: each
    registers its own, once, in that order."""
    for nb in syllabus.notebooks():
        if nb.exercises:
            importlib.import_module(nb.exercises)
    importlib.import_module("course.exercises.questions")


register_all()


def get(id: str) -> Exercise:
    """The registered exercise ``id`` (a ``KeyError`` naming the known ones otherwise)."""
    if id not in REGISTRY:
        register_all()
    if id not in REGISTRY:
        raise KeyError(f"unknown exercise {id!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[id]


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
