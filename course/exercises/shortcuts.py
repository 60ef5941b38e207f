"""Which of the course's own implementations a student's function calls while it is checked.

An exercise names its shortcuts: functions and classes of the course that implement what the student is asked
to write (the SnapKV build names ``course.policies.SnapKV`` and ``course.compression.compress_prompt``). While the
student's function runs, a profile hook watches for a call into any of their code objects (for a class, every
function defined in it and in its course base classes, except those of ``Policy`` itself, which every cache
calls). The first one reached is named in the feedback.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterable
from types import CodeType
from typing import Any

__all__ = ["Watched", "code_objects", "call_watching"]

_SHARED_BASES = ("course.policies.Policy", "course.storage.Storage")  # every cache calls these: not shortcuts


def _qualified(obj: Any) -> str:
    """``module.qualname`` of a function or class, under the shortest package that exports it (where a student
    imports it from: ``course.policies.SnapKV``, not the file that defines it)."""
    obj = inspect.unwrap(obj)
    module = getattr(obj, "__module__", None) or "?"
    qualname = getattr(obj, "__qualname__", type(obj).__name__)
    head = qualname.split(".")[0]
    defined = getattr(sys.modules.get(module), head, None)
    parts = module.split(".")
    for i in range(1, len(parts)):
        package = ".".join(parts[:i])
        if defined is not None and getattr(sys.modules.get(package), head, None) is defined:
            return f"{package}.{qualname}"
    return f"{module}.{qualname}"


def _functions_of(obj: Any) -> Iterable[Any]:
    """The plain functions a shortcut consists of (a function, or a class's methods and properties)."""
    if inspect.isclass(obj):
        for cls in obj.__mro__:
            if not cls.__module__.startswith("course.") or _qualified(cls) in _SHARED_BASES:
                continue
            for member in vars(cls).values():
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if isinstance(member, property):
                    yield from (f for f in (member.fget, member.fset) if f is not None)
                elif inspect.isfunction(member):
                    yield member
    else:
        yield inspect.unwrap(obj)


def code_objects(shortcuts: Iterable[Any]) -> dict[CodeType, str]:
    """{code object: the shortcut's name} for every function a list of shortcuts consists of."""
    codes: dict[CodeType, str] = {}
    for shortcut in shortcuts:
        for fn in _functions_of(shortcut):
            code = getattr(fn, "__code__", None)
            if code is not None:
                codes.setdefault(code, _qualified(shortcut))
    return codes


def call_watching(fn: Callable, args: tuple, kwargs: dict, codes: dict[CodeType, str]) -> tuple[Any, str | None]:
    """(what ``fn`` returned, the first shortcut it reached or None); an exception propagates with that name
    attached as ``_course_reached``."""
    reached: list[str] = []

    def profile(frame, event, arg) -> None:
        if event == "call" and not reached and frame.f_code in codes:
            reached.append(codes[frame.f_code])

    previous = sys.getprofile()
    sys.setprofile(profile if codes else previous)
    try:
        return fn(*args, **kwargs), (reached[0] if reached else None)
    except BaseException as e:
        e._course_reached = reached[0] if reached else None  # type: ignore[attr-defined]
        raise
    finally:
        sys.setprofile(previous)


class Watched:
    """A student's function that records the first shortcut it reaches (``reached``) over all its calls."""

    def __init__(self, fn: Callable, shortcuts: Iterable[Any]) -> None:
        self.fn, self.codes, self.reached = fn, code_objects(shortcuts), None
        self.__wrapped__ = fn  # signature checks (inspect.signature) see the student's function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            result, reached = call_watching(self.fn, args, kwargs, self.codes)
        except BaseException as e:
            self.reached = self.reached or getattr(e, "_course_reached", None)
            raise
        self.reached = self.reached or reached
        return result
