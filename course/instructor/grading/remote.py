"""The grader's side of a graded check: the checker runs here, the student's function over a socket.

``CheckServer`` listens on a Unix socket in the grader's private folder. Each ``check(...)`` cell of
the notebook connects (see ``course.exercises.serve``), names its exercise and then answers calls.
The server runs the exercise's checker in the grader's process with a ``StudentFunction`` in place
of the student's function: each call sends the checker's arguments by value (objects the checker
keeps, such as a model wrapped in a call counter, as handles) and receives the answer as plain data.
The result of each exercise is decided here, once (the first check of an exercise counts). What the key
adds to a check (a question's answer, the capstone's held-out measurement) runs here too, after the checker
passed (``measures``).
"""

from __future__ import annotations

import hmac
import inspect
import os
import secrets
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from time import monotonic
from typing import Any
from collections.abc import Callable

import torch

from course.exercises import wire
from course.exercises.core import Exercise, StudentRaised, outcome, shortcut_feedback

Measure = Callable[[Callable], "str | None"]

__all__ = ["CheckServer", "CheckResult", "StudentFunction", "WorkerLost", "GRADE_PREFIX", "RECHECK_PREFIX",
           "check_socket_room", "socket_base", "socket_folder"]

HELLO_TIMEOUT = 10.0  # seconds a connection may take to name its exercise
SOCKET_PATH_MAX = 103  # bytes of a Unix socket's path: 107 on Linux, 103 on macOS (the C string's NUL not counted)
SOCKET_NAME_ROOM = 32  # the longest path the grader and a kernel put inside the folder ("control/grader.sock", ...)
SHORT_TMP = "/tmp"  # where the folder goes when TMPDIR is too long
GRADE_PREFIX, RECHECK_PREFIX = "course-grade-", "course-recheck-"  # the private folders of a run and of a second check


def socket_base(prefix: str) -> str:
    """Where ``socket_folder(prefix)`` makes its folder: ``TMPDIR`` when its path leaves room for the sockets
    (``SOCKET_PATH_MAX``), else ``SHORT_TMP`` (``/tmp``); ``RuntimeError`` (one line, naming ``TMPDIR``) when
    neither does."""
    suffix = len(os.sep + prefix) + 8 + len(os.sep) + SOCKET_NAME_ROOM  # mkdtemp adds 8 random characters
    for base in (tempfile.gettempdir(), SHORT_TMP):
        if len(os.fsencode(base)) + suffix <= SOCKET_PATH_MAX and os.access(base, os.W_OK | os.X_OK):
            return base
    raise RuntimeError(f"TMPDIR={tempfile.gettempdir()!r} is too long for the grader's sockets (at most "
                       f"{SOCKET_PATH_MAX - suffix} characters) and {SHORT_TMP} is too long or not writable: set "
                       "TMPDIR to a shorter folder")


def check_socket_room() -> None:
    """``RuntimeError`` before anything is graded when a run's or a second check's sockets would find no room
    (``socket_base``), rather than an error row for every submission."""
    for prefix in (GRADE_PREFIX, RECHECK_PREFIX):
        socket_base(prefix)


def socket_folder(prefix: str) -> tempfile.TemporaryDirectory:
    """A private temporary folder (random name, mode 700) short enough to hold the Unix sockets of a graded run.

    Under ``TMPDIR`` when its path leaves room (``SOCKET_PATH_MAX``), else under ``/tmp``: a long ``TMPDIR``
    would otherwise make every submission's kernel fail with "AF_UNIX path too long"."""
    return tempfile.TemporaryDirectory(prefix=prefix, dir=socket_base(prefix))


class WorkerLost(BaseException):
    """The kernel stopped answering (time limit, crash or garbage): not something a checker may catch."""

    def __init__(self, reason: str, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.timed_out = reason, timed_out


@dataclass(frozen=True)
class CheckResult:
    status: str  # pass, partial, wrong, error, not_done, forwarded, timeout
    feedback: str
    points: int = 0  # what the check earned (all of the exercise's on pass)


class _Handles:
    """Objects of the checker the kernel may use, by number; only through calls and public attributes."""

    def __init__(self) -> None:
        self.objects: list[Any] = []

    def export(self, obj: Any) -> wire.Ref:
        for i, known in enumerate(self.objects):
            if known is obj:
                return wire.Ref(i)
        self.objects.append(obj)
        return wire.Ref(len(self.objects) - 1)

    def resolve(self, value: Any) -> Any:
        if isinstance(value, wire.Ref):
            if 0 <= value.id < len(self.objects):
                return self.objects[value.id]
            return wire.Opaque("Ref", "unknown handle")
        if isinstance(value, (list, tuple)):
            items = [self.resolve(v) for v in value]
            return items if isinstance(value, list) else tuple(items)
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        return value

    def perform(self, op: str, ref: Any, name: Any, args: Any, kwargs: Any) -> Any:
        """One request of the kernel on a kept object; raises what the kernel should see."""
        if not isinstance(ref, int) or not 0 <= ref < len(self.objects):
            raise ValueError("unknown handle")
        obj = self.objects[ref]
        if op == "getattr":
            if not isinstance(name, str) or name.startswith("_"):
                raise AttributeError(f"{name!r} is not available while grading")
            return getattr(obj, name)
        if op == "getitem":
            return obj[self.resolve(name)]
        if op == "len":
            return len(obj)
        if op == "call":
            if not callable(obj) or (inspect.ismethod(obj) and _from_torch(obj.__func__)) or inspect.isbuiltin(obj):
                raise TypeError("only the checker's own objects can be called while grading "
                                "(torch methods that change them cannot)")
            if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
                raise TypeError("malformed call")
            with torch.no_grad():
                return obj(*self.resolve(tuple(args)), **{str(k): v for k, v in self.resolve(kwargs).items()})
        raise ValueError(f"unknown request {op!r}")


def _from_torch(fn: Any) -> bool:
    return (getattr(fn, "__module__", None) or "").startswith("torch")


class StudentFunction:
    """Stands for the student's function in the checker: each call is answered by the kernel."""

    def __init__(self, conn: socket.socket, deadline: float) -> None:
        self.conn, self.deadline, self.handles = conn, deadline, _Handles()
        self.calls = 0
        self.reached: str | None = None  # the first shortcut the kernel saw the function reach

    def receive(self) -> Any:
        left = self.deadline - monotonic()
        if left <= 0:
            raise WorkerLost("time limit", timed_out=True)
        self.conn.settimeout(left)
        try:
            return wire.recv(self.conn)
        except TimeoutError:
            raise WorkerLost("time limit", timed_out=True) from None
        except (wire.WireError, OSError) as e:
            raise WorkerLost(f"the kernel stopped answering ({e})") from None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        call_id = self.calls
        try:
            wire.send(self.conn, ("call", call_id, wire.to_plain(args, self.handles.export),
                                  wire.to_plain(kwargs, self.handles.export)))
        except (wire.WireError, OSError) as e:
            raise WorkerLost(f"the kernel stopped answering ({e})") from None
        while True:
            message = self.receive()
            kind = message[0] if isinstance(message, tuple) and message else None
            if kind == "cb" and len(message) == 6:
                self._serve_request(*message[1:])
            elif kind == "returned" and len(message) == 4 and message[1] == call_id:
                self._reached(message[3])
                return self.handles.resolve(message[2])
            elif kind == "raised" and len(message) == 7 and message[1] == call_id:
                _, _, type_name, text, where, reached, not_done = message
                self._reached(reached)
                if not_done:
                    raise NotImplementedError(str(text))
                raise StudentRaised(str(type_name), str(text), str(where))
            else:
                raise WorkerLost("the kernel sent something that is not an answer")

    def _reached(self, name: Any) -> None:
        if self.reached is None and isinstance(name, str) and name:
            self.reached = name[:200]

    def _serve_request(self, op: Any, ref: Any, name: Any, args: Any, kwargs: Any) -> None:
        try:
            reply = ("cb_value", wire.to_plain(self.handles.perform(op, ref, name, args, kwargs), self.handles.export))
        except Exception as e:  # the checker's object raised, or the request was refused
            reply = ("cb_error", type(e).__name__, str(e)[:500])
        try:
            wire.send(self.conn, reply)
        except (wire.WireError, OSError) as e:
            raise WorkerLost(f"the kernel stopped answering ({e})") from None


def check_remotely(ex: Exercise, conn: socket.socket, is_shortcut: str, time_limit: float,
                   measure: Measure | None = None) -> CheckResult | None:
    """Run ``ex``'s checker (then ``measure``) against the function the kernel serves on ``conn``; None when the
    kernel broke off (its cell's outcome then explains what happened)."""
    fn = StudentFunction(conn, monotonic() + time_limit)
    try:
        status, feedback, points = outcome(ex, fn, measure)
    except WorkerLost as lost:
        if lost.timed_out:
            return CheckResult("timeout", f"timed out after {time_limit:g} s while your function was checked "
                                          "(an endless loop?)")
        return None
    if is_shortcut:
        return CheckResult("forwarded", shortcut_feedback(is_shortcut))
    return CheckResult(status, feedback, points)


class CheckServer:
    """Accepts the check connections of one submission's kernel and records one result per exercise."""

    def __init__(self, folder: Path, exercises: list[Exercise], time_limit: float,
                 measures: dict[str, Measure] | None = None) -> None:
        self.path = folder / "grader.sock"
        self.token = secrets.token_hex(16)
        self.exercises = {ex.id: ex for ex in exercises}
        self.measures = measures or {}
        self.time_limit = time_limit
        self.results: dict[str, CheckResult] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        self._listener.listen(8)
        self._listener.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, name="course-check-server", daemon=True)

    def env(self) -> dict[str, str]:
        from course.exercises.serve import SOCKET_ENV, TOKEN_ENV

        return {SOCKET_ENV: str(self.path), TOKEN_ENV: self.token}

    def __enter__(self) -> CheckServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.time_limit + 5)
        self._listener.close()
        self.path.unlink(missing_ok=True)

    def snapshot(self) -> dict[str, CheckResult]:
        with self._lock:
            return dict(self.results)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                self._one_check(conn)

    def _one_check(self, conn: socket.socket) -> None:
        conn.settimeout(HELLO_TIMEOUT)
        try:
            hello = wire.recv(conn)
        except (wire.WireError, OSError):
            return
        if not (isinstance(hello, tuple) and len(hello) == 4 and hello[0] == "hello" and isinstance(hello[1], str)
                and hmac.compare_digest(hello[1], self.token)):
            return
        ex = self.exercises.get(hello[2]) if isinstance(hello[2], str) else None
        with self._lock:
            if ex is None or ex.id in self.results:
                ex = None
        if ex is not None:
            shortcut = hello[3] if isinstance(hello[3], str) else ""
            result = check_remotely(ex, conn, shortcut, self.time_limit, self.measures.get(ex.id))
            if result is not None:
                with self._lock:
                    self.results.setdefault(ex.id, result)
        try:
            conn.settimeout(1.0)
            wire.send(conn, ("done",))
        except (wire.WireError, OSError):
            pass
