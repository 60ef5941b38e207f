"""A second check of every exercise that has shortcuts, in a world where they are absent.

In the submission's kernel the course is whole: the notebook's later cells need it. There a watch notices a
function that hands its work back to the course's own implementation, but the watch lives in the student's
process, which can switch it off. So the grader checks each such exercise a second time, from its own
process, against the student's function defined again inside a fresh sandbox whose ``course`` package is a
stripped copy (``strip_course``): the exercise's shortcuts, and the private helpers they call, raise
``ABSENT``; the original source is not in that world at all. A function that still reaches one is reported as
``forwarded``; one that does its own work gets the checker's verdict, and that verdict is the exercise's.

What is defined again (``notebook_definitions``): the top-level imports, functions, classes and plain constants
(assignments that call nothing) of the cells up to the exercise's check cell, the student's and the course's
alike; nothing that computes. An earlier exercise that did not pass is replaced by a stand-in the grader
computes with the course's implementation (a handle: the course's code stays in the grader), so an exercise
left undone is never held against the next one.
"""

from __future__ import annotations

import ast
import atexit
import functools
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from time import monotonic

import nbformat

from course.exercises import wire
from course.exercises.core import Exercise, outcome
from course.exercises.replay import EXERCISE_ENV
from course.exercises.serve import ABSENT, SOCKET_ENV, TOKEN_ENV
from course.exercises.shortcuts import code_objects
from course.instructor.grading.isolation import Isolation, course_dir, kernel_env
from course.instructor.grading.remote import (RECHECK_PREFIX, CheckResult, StudentFunction, WorkerLost,
                                              socket_folder)
from course.instructor.grading.sandbox import Limits

__all__ = ["strip_course", "notebook_definitions", "check_call", "recheck", "second_checks", "RECHECKED"]

RECHECKED = ("pass", "partial", "forwarded")  # kernel verdicts a second check can change
START_TIMEOUT = 120.0  # seconds the replay process may take to start and connect
_STRIPPED: dict[str, Path] = {}


@functools.cache
def _workspace() -> Path:
    """The folder of this grading process's stripped copies (removed when it exits)."""
    folder = tempfile.TemporaryDirectory(prefix="course-stripped-")
    atexit.register(folder.cleanup)
    return Path(folder.name)


def _absent_body(name: str, node: ast.AST) -> list[ast.stmt]:
    body = ast.parse(f"raise RuntimeError({f'{name} {ABSENT}: write it yourself'!r})").body
    return [ast.copy_location(body[0], node)]


def _private_names(node: ast.AST) -> set[str]:
    """The private names (``_x``, ``self._x``) a function's body uses."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id.startswith("_") and not sub.id.startswith("__"):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute) and sub.attr.startswith("_") and not sub.attr.startswith("__"):
            names.add(sub.attr)
    return names


def _used_on_import(tree: ast.Module) -> set[str]:
    """Names the module uses while it is imported: decorators, defaults, and statements outside functions."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                parts = [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]
            elif isinstance(node, ast.ClassDef):
                parts = [*node.decorator_list, *node.bases]
                visit(node.body)
            else:
                parts = [node]
            names.update(sub.id for part in parts if part is not None for sub in ast.walk(part)
                         if isinstance(sub, ast.Name))

    visit(tree.body)
    return names


def _strip_module(source: str, lines: dict[int, str]) -> str:
    """``source`` with every function that starts on one of ``lines`` (line -> shortcut name), and every private
    function or method of the module they use (transitively; not those the import itself runs), raising
    ``ABSENT``."""
    tree = ast.parse(source)
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    on_import = _used_on_import(tree)

    def first_line(fn: ast.AST) -> int:
        return min([d.lineno for d in fn.decorator_list] + [fn.lineno])

    chosen = {id(fn): lines.get(first_line(fn)) or lines.get(fn.lineno) for fn in functions}
    todo = [fn for fn in functions if chosen[id(fn)]]
    while todo:  # the private helpers of what is stripped go too
        fn = todo.pop()
        used = _private_names(fn)
        for other in functions:
            if not chosen[id(other)] and other.name in used and other.name not in on_import:
                chosen[id(other)] = chosen[id(fn)]
                todo.append(other)
    for fn in functions:
        if chosen[id(fn)]:
            fn.body = _absent_body(chosen[id(fn)], fn)
    return ast.unparse(tree) + "\n"


def strip_course(ex: Exercise) -> Path:
    """A folder holding a copy of the ``course`` package in which ``ex``'s shortcuts are absent (made once per
    exercise and grading process)."""
    if ex.id in _STRIPPED:
        return _STRIPPED[ex.id]
    source_dir = course_dir()
    dest = _workspace() / re.sub(r"\W", "_", ex.id) / "course"
    shutil.copytree(source_dir, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    by_file: dict[str, dict[int, str]] = {}
    for code, name in code_objects(ex.shortcuts).items():
        by_file.setdefault(code.co_filename, {})[code.co_firstlineno] = name
    for filename, lines in by_file.items():
        try:
            relative = Path(filename).resolve().relative_to(source_dir)
        except ValueError:  # not the course's own code: nothing to strip
            continue
        target = dest / relative
        target.write_text(_strip_module(target.read_text(encoding="utf-8"), lines), encoding="utf-8")
    _STRIPPED[ex.id] = dest
    return dest


def check_call(nb: nbformat.NotebookNode, exercise_id: str) -> tuple[int, str, str] | None:
    """(index of the check cell, the name it rebinds, the name of the function it checks) of ``exercise_id``."""
    pattern = re.compile(r"^\s*(?:(\w+)\s*=\s*)?check\(\s*['\"]" + re.escape(exercise_id) + r"['\"]\s*,\s*(\w+)",
                         re.M)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            found = pattern.search(cell.source)
            if found:
                return index, found.group(1) or found.group(2), found.group(2)
    return None


def _calls_nothing(node: ast.AST) -> bool:
    return not any(isinstance(sub, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr))
                   for sub in ast.walk(node))


def _cell_code(source: str) -> str:
    """A cell's source without IPython's magics and shell escapes."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def notebook_definitions(nb: nbformat.NotebookNode, upto: int) -> list[str]:
    """The imports, functions, classes and plain constants of the code cells before cell ``upto``, in order."""
    statements = []
    for cell in nb.cells[:upto]:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(_cell_code(cell.source))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                statements.append(ast.unparse(node))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None \
                    and _calls_nothing(node.value):
                statements.append(ast.unparse(node))
    return statements


def _command(stripped: Path, scratch: Path, isolation: Isolation | None, limits: Limits) -> list[str]:
    argv = [sys.executable, "-m", "course.exercises.replay"]
    if isolation is not None:
        argv = isolation.command(argv, [scratch], scratch, over={course_dir(): stripped})
    return [sys.executable, "-m", "course.instructor.grading.sandbox", *limits.args(), "--", *argv]


def _accept(listener: socket.socket, token: str, exercise_id: str, process: subprocess.Popen) -> socket.socket | None:
    deadline = monotonic() + START_TIMEOUT
    while monotonic() < deadline and process.poll() is None:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        conn.settimeout(10.0)
        try:
            hello = wire.recv(conn)
        except (wire.WireError, OSError):
            conn.close()
            continue
        if isinstance(hello, tuple) and hello[:3] == ("hello", token, exercise_id):
            return conn
        conn.close()
    return None


def recheck(ex: Exercise, nb: nbformat.NotebookNode, call: tuple[int, str, str], stand_ins: dict[str, Callable], *,
            isolation: Isolation | None, time_limit: float, limits: Limits, extra_env: dict[str, str],
            measure: Callable | None = None) -> CheckResult:
    """``ex`` checked again on the student's function defined in a world without its shortcuts (module doc);
    ``call``: its check cell, as ``check_call`` found it."""
    cell, _, name = call
    statements = notebook_definitions(nb, cell)
    stripped = strip_course(ex).parent
    token = secrets.token_hex(16)
    with socket_folder(RECHECK_PREFIX) as tmp, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        scratch = Path(tmp)
        listener.bind(str(scratch / "grader.sock"))
        listener.listen(2)
        listener.settimeout(0.2)
        env = kernel_env(scratch, {**extra_env, SOCKET_ENV: str(scratch / "grader.sock"), TOKEN_ENV: token,
                                   EXERCISE_ENV: ex.id})
        if isolation is None:
            env["PYTHONPATH"] = str(stripped)
        process = subprocess.Popen(_command(stripped / "course", scratch, isolation, limits), env=env,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
        try:
            return _judge(ex, process, listener, token, statements, name, stand_ins, time_limit, measure)
        finally:
            _stop(process)


def _judge(ex: Exercise, process: subprocess.Popen, listener: socket.socket, token: str, statements: list[str],
           name: str, stand_ins: dict[str, Callable], time_limit: float, measure: Callable | None) -> CheckResult:
    conn = _accept(listener, token, ex.id, process)
    if conn is None:
        return CheckResult("error", "the second check, where the course's implementation is absent, could not start")
    with conn:
        fn = StudentFunction(conn, monotonic() + time_limit)
        refs = {alias: fn.handles.export(stand_in) for alias, stand_in in stand_ins.items()}
        try:
            wire.send(conn, ("setup", statements, name, refs))
            ready = fn.receive()
        except (wire.WireError, OSError, WorkerLost):
            return CheckResult("error", "the second check, where the course's implementation is absent, broke off")
        if not (isinstance(ready, tuple) and ready[:1] == ("ready",)):
            why = ready[1] if isinstance(ready, tuple) and len(ready) == 2 else "no answer"
            return CheckResult("error", f"checked where the course's implementation is absent: {str(why)[:300]}")
        try:
            status, feedback, points = outcome(ex, fn, measure)
        except WorkerLost as lost:
            if lost.timed_out:
                return CheckResult("timeout", f"timed out after {time_limit:g} s while your function was checked")
            return CheckResult("error", f"checked where the course's implementation is absent: {lost.reason}")
        try:
            wire.send(conn, ("done",))
        except (wire.WireError, OSError):
            pass
    return CheckResult(status, feedback, points)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # the supervisor kills everything below it
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def second_checks(nb: nbformat.NotebookNode, exercises: list[Exercise], results: dict[str, CheckResult], *,
                  isolation: Isolation | None, time_limit: float, limits: Limits, extra_env: dict[str, str],
                  measures: dict[str, Callable]) -> dict[str, CheckResult]:
    """``results`` (the kernel's verdicts) with every exercise that has shortcuts, and that the kernel passed or
    found forwarding, checked again where they are absent (in the notebook's order: an earlier exercise that did
    not pass stands in as the course's implementation, computed by the grader)."""
    calls = {ex.id: check_call(nb, ex.id) for ex in exercises}
    order = sorted((calls[ex.id][0], ex.id, ex) for ex in exercises if calls[ex.id] is not None)
    final = dict(results)
    for cell, _, ex in order:
        result = final.get(ex.id)
        if not ex.shortcuts or result is None or result.status not in RECHECKED:
            continue
        stand_ins = {calls[other.id][1]: other.fallback for other_cell, _, other in order
                     if other_cell < cell and other.fallback is not None
                     and getattr(final.get(other.id), "status", None) != "pass"}
        again = recheck(ex, nb, calls[ex.id], stand_ins, isolation=isolation, time_limit=time_limit, limits=limits,
                        extra_env=extra_env, measure=measures.get(ex.id))
        final[ex.id] = _missing_name(again) if result.status != "forwarded" else again
    return final


def _missing_name(result: CheckResult) -> CheckResult:
    """A function that passed in the kernel but needs, defined again, a name the notebook computed (a global made
    by a call, which is not run again): for the instructor to look at, not a zero."""
    raised = "your function raised "
    if result.status == "error" and result.feedback.startswith(raised + "NameError"):
        return CheckResult("review", "correct in the notebook, but defined again without the course's own "
                                     "implementation it needs a name your notebook computed ("
                           + result.feedback[len(raised):]
                           + "): points withheld until reviewed; pass it as an argument or define it in the "
                             "function")
    return result
