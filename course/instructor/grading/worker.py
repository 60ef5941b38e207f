"""The kernel's side of a graded check: answer the grader's calls with the student's function.

When the autograder runs a notebook, ``check(id, fn)`` calls ``serve(id, fn, reference)``: it connects
to the grader (socket path and token in the kernel's environment), and then, until the grader says
"done", calls ``fn`` with the arguments the grader sends and sends back what it returned or raised.
The grader runs the checker and decides pass or fail in its own process; nothing here computes or
reports a score. Objects the grader keeps (the checker's model, a cache, a policy) arrive as
``RemoteObject`` handles: calling one, reading a public attribute or indexing it asks the grader.

While ``fn`` runs, the worker watches whether the exercise's reference implementation is entered (a
profile hook on its code object) and says so with the answer; the grader reports such an answer as
forwarded to the reference. This code runs in the student's process: a submission can disable it,
but only to its own loss, since a silent or wrong answer scores nothing.
"""

from __future__ import annotations

import inspect
import os
import socket
import sys
import traceback
from collections.abc import Callable
from typing import Any

from course.instructor.grading import wire

__all__ = ["SOCKET_ENV", "TOKEN_ENV", "RemoteObject", "serve", "grading"]

SOCKET_ENV = "COURSE_GRADER_SOCKET"
TOKEN_ENV = "COURSE_GRADER_TOKEN"


def grading() -> bool:
    """True inside a kernel started by the autograder."""
    return bool(os.environ.get(SOCKET_ENV))


class RemoteObject:
    """An object the grader keeps; every use is a request to the grader."""

    __slots__ = ("_sock", "_id")

    def __init__(self, sock: socket.socket, ref: wire.Ref) -> None:
        object.__setattr__(self, "_sock", sock)
        object.__setattr__(self, "_id", ref.id)

    def _ask(self, op: str, name: Any = None, args: tuple = (), kwargs: dict | None = None) -> Any:
        wire.send(self._sock, ("cb", op, self._id, name, _outgoing(args), _outgoing(kwargs or {})))
        reply = wire.recv(self._sock)
        if reply[0] == "cb_value":
            return _incoming(self._sock, reply[1])
        errors = {"AttributeError": AttributeError, "TypeError": TypeError, "IndexError": IndexError,
                  "KeyError": KeyError, "ValueError": ValueError}
        raise errors.get(reply[1], RuntimeError)(reply[2])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._ask("call", None, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __getitem__(self, key: Any) -> Any:
        return self._ask("getitem", key)

    def __len__(self) -> int:
        return int(self._ask("len"))

    def __repr__(self) -> str:
        return f"<object kept by the grader #{self._id}>"


def _outgoing(value: Any) -> Any:
    def export(obj: Any) -> Any:
        if isinstance(obj, RemoteObject):
            return wire.Ref(obj._id)
        return wire.Opaque(type(obj).__name__, "not plain data")

    return wire.to_plain(value, export)


def _incoming(sock: socket.socket, value: Any) -> Any:
    if isinstance(value, wire.Ref):
        return RemoteObject(sock, value)
    if isinstance(value, (list, tuple)):
        items = [_incoming(sock, v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: _incoming(sock, v) for k, v in value.items()}
    return value


def _reference_code(reference: Callable) -> Any:
    return getattr(inspect.unwrap(reference), "__code__", None)


def _call_watching(fn: Callable, args: tuple, kwargs: dict, target: Any) -> tuple[Any, bool]:
    """(what ``fn`` returned, whether the reference's code ran meanwhile); exceptions propagate with
    the flag attached as ``_course_reached``."""
    reached = False

    def profile(frame, event, arg) -> None:
        nonlocal reached
        if event == "call" and frame.f_code is target:
            reached = True

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        return fn(*args, **kwargs), reached
    except BaseException as e:
        e._course_reached = reached  # type: ignore[attr-defined]
        raise
    finally:
        sys.setprofile(previous)


def _where(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    return next((f"line {f.lineno}" for f in reversed(frames) if "course" not in f.filename), "")


def _answer(sock: socket.socket, fn: Callable, call_id: int, args: Any, kwargs: Any, target: Any) -> None:
    try:
        result, reached = _call_watching(fn, _incoming(sock, args), _incoming(sock, kwargs), target)
    except Exception as e:
        wire.send(sock, ("raised", call_id, type(e).__name__, str(e)[:500], _where(e),
                         bool(getattr(e, "_course_reached", False)), isinstance(e, NotImplementedError)))
        return
    wire.send(sock, ("returned", call_id, _outgoing(result), reached))


def serve(exercise_id: str, fn: Callable, reference: Callable) -> None:
    """Answer the grader's calls of ``fn`` for one exercise; returns when the grader is done (or absent)."""
    path, token = os.environ.get(SOCKET_ENV), os.environ.get(TOKEN_ENV, "")
    if not path:
        return
    target = _reference_code(reference)
    is_reference = fn is reference or (target is not None and _reference_code(fn) is target)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
    except OSError:
        return
    with sock:
        try:
            wire.send(sock, ("hello", token, exercise_id, is_reference))
            while True:
                message = wire.recv(sock)
                if message[0] != "call":
                    return
                _, call_id, args, kwargs = message
                _answer(sock, fn, call_id, args, kwargs, target)
        except (wire.WireError, OSError):
            return
