"""The kernel's side of a graded check: answer the grader's calls with the student's function.

When the autograder runs a notebook, ``check(id, fn)`` calls ``serve(id, fn, shortcuts)``: it connects
to the grader (socket path and token in the kernel's environment), and then, until the grader says
"done", calls ``fn`` with the arguments the grader sends and sends back what it returned or raised.
The grader runs the checker and decides pass or fail in its own process; nothing here computes or
reports a score. Objects the grader keeps (the checker's model, a cache, a policy) arrive as
``RemoteObject`` handles: calling one, reading a public attribute or indexing it asks the grader.

While ``fn`` runs, the kernel watches whether one of the exercise's shortcuts (the course's own implementation
of what the exercise asks for, ``course.exercises.shortcuts``) is entered and names it with the answer. This code
runs in the student's process, so it decides nothing: the grader checks every exercise with shortcuts a second
time, where they are absent (``course.exercises.replay``, ``course.instructor.grading.stripped``), and that
verdict is the exercise's.
"""

from __future__ import annotations

import inspect
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

from course.exercises import wire
from course.exercises.shortcuts import call_watching, code_objects

__all__ = ["SOCKET_ENV", "TOKEN_ENV", "ABSENT", "RemoteObject", "serve", "grading", "answer_calls", "absent_name"]

SOCKET_ENV = "COURSE_GRADER_SOCKET"
TOKEN_ENV = "COURSE_GRADER_TOKEN"
ABSENT = "is not available while this exercise is graded"  # what a stripped shortcut raises (course.exercises.replay)


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


def _where(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    return next((f"line {f.lineno}" for f in reversed(frames) if "course" not in f.filename), "")


def absent_name(e: BaseException | None) -> str:
    """The shortcut named by an ``ABSENT`` error in ``e`` or the exceptions it came from ('' when none)."""
    seen = 0
    while e is not None and seen < 20:
        text = str(e)
        if ABSENT in text:
            return text.split(ABSENT)[0].strip()[-200:]
        e, seen = e.__cause__ or e.__context__, seen + 1
    return ""


def _answer(sock: socket.socket, fn: Callable, call_id: int, args: Any, kwargs: Any, codes: dict) -> None:
    try:
        result, reached = call_watching(fn, _incoming(sock, args), _incoming(sock, kwargs), codes)
    except Exception as e:
        wire.send(sock, ("raised", call_id, type(e).__name__, str(e)[:500], _where(e),
                         getattr(e, "_course_reached", None) or absent_name(e), isinstance(e, NotImplementedError)))
        return
    wire.send(sock, ("returned", call_id, _outgoing(result), reached or ""))


def answer_calls(sock: socket.socket, fn: Callable, codes: dict) -> None:
    """Answer the grader's ``call`` messages with ``fn`` until it says anything else."""
    while True:
        message = wire.recv(sock)
        if message[0] != "call":
            return
        _, call_id, args, kwargs = message
        _answer(sock, fn, call_id, args, kwargs, codes)


def serve(exercise_id: str, fn: Callable, shortcuts: tuple = ()) -> None:
    """Answer the grader's calls of ``fn`` for one exercise; returns when the grader is done (or absent).
    ``shortcuts``: the exercise's (see ``course.exercises.shortcuts``), watched while ``fn`` answers."""
    path, token = os.environ.get(SOCKET_ENV), os.environ.get(TOKEN_ENV, "")
    if not path:
        return
    codes = code_objects(shortcuts)
    own = getattr(inspect.unwrap(fn), "__code__", None)
    is_shortcut = codes.get(own, "") if own is not None else ""  # the function *is* one of the course's
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
    except OSError:
        return
    with sock:
        try:
            wire.send(sock, ("hello", token, exercise_id, is_shortcut))
            answer_calls(sock, fn, codes)
        except (wire.WireError, OSError):
            return
