"""A graded function defined again where the course's own implementation of its exercise is absent.

The grader starts ``python -m course.exercises.replay`` for an exercise that has shortcuts (see
``course.exercises.shortcuts``) inside a sandbox whose ``course`` package is a stripped copy: every shortcut of
that exercise, and the private helpers they call, raise ``... is not available while this exercise is graded``
(``course.instructor.grading.stripped``). The original source is not in that world, so neither a call, nor an
``inspect.getsource`` copy, nor a switched-off watch can reach it.

This process connects to the grader (socket and token in its environment, like a kernel's), names its exercise
and receives what to define: the top-level imports, functions, classes and plain constants of the student's
notebook up to the exercise's check cell (each run on its own; one that fails is skipped: it ran in the kernel
already), the name of the function to answer with, and the stand-ins for earlier exercises the student did not
get right (handles: the grader computes them with the course's implementation, so an undone exercise is never
held against the next). Then it answers the grader's calls as a kernel does (``course.exercises.serve``).
"""

from __future__ import annotations

import os
import socket
import sys

from course.exercises import wire
from course.exercises.serve import SOCKET_ENV, TOKEN_ENV, RemoteObject, answer_calls

__all__ = ["main", "define"]

EXERCISE_ENV = "COURSE_REPLAY_EXERCISE"


def define(statements: list[str]) -> dict:
    """A namespace in which each of ``statements`` ran (those that raised left nothing)."""
    namespace: dict = {"__name__": "__main__"}
    for number, source in enumerate(statements):
        try:
            exec(compile(source, f"<notebook statement {number + 1}>", "exec"), namespace)
        except Exception:  # it ran in the kernel; here only what the function needs must be defined
            pass
    return namespace


def main() -> int:
    path, token, exercise = os.environ.get(SOCKET_ENV), os.environ.get(TOKEN_ENV, ""), os.environ.get(EXERCISE_ENV)
    if not path or not exercise:
        print("course.exercises.replay is started by the grader", file=sys.stderr)
        return 2
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
            wire.send(sock, ("hello", token, exercise, ""))
            setup = wire.recv(sock)
            if not (isinstance(setup, tuple) and len(setup) == 4 and setup[0] == "setup"):
                return 2
            _, statements, name, stand_ins = setup
            namespace = define(list(statements))
            for alias, ref in dict(stand_ins).items():
                namespace[str(alias)] = RemoteObject(sock, ref)
            fn = namespace.get(str(name))
            if not callable(fn):
                wire.send(sock, ("setup_failed", f"no function {name!r} is defined by the notebook's cells before "
                                                 "its check cell"))
                return 0
            wire.send(sock, ("ready",))
            answer_calls(sock, fn, {})
        except (wire.WireError, OSError):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
