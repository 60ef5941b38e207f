"""The autograder: ``python -m course grade PATH... [--layout folders|flat] [--out DIR] ...``.

Submissions are found and named by ``course.instructor.grading.submissions`` (one explicit layout rule). Each
submission runs top to bottom in a fresh ``python3`` kernel inside its own bubblewrap sandbox
(``course.instructor.grading.isolation``: its scratch and control folders and the read-only install, nothing
else of this machine; no network; an allow-listed environment; channels over IPC) under the supervisor of
``course.instructor.grading.sandbox`` (CPU / memory / file-size limits, everything it starts killed when it
ends), with ``FAST = True`` and ``AUTOFILL = False`` injected after its ``parameters`` cell. The grader decides,
the kernel only answers: at each ``check(...)`` cell the kernel connects to the grader, and the grader runs the
exercise's checker in its own process, calling the student's function in the kernel with the checker's inputs
(``course.instructor.grading.remote``), drawn for the release being graded (``course.exercises.fixtures.exam``).
Nothing the kernel writes, patches or prints is read as a result. Every exercise with shortcuts is then checked a
second time where they are absent (``course.instructor.grading.stripped``), and that verdict is the exercise's.

Running the notebook is ``course.instructor.grading.execution``'s: a cell that raises does not stop the run; a
cell that runs longer than the per-cell timeout, or prints more than the output limit, is interrupted; the whole
notebook also has an overall time limit.

Every registered exercise of the notebook (``course.exercises.REGISTRY``, ids ``"NN.*"``) gets one row:
``student, notebook, exercise, points, max_points, status, feedback, submission, sha256, cells_failed, isolation``
(``cells_failed``: every cell of the submission that raised, whatever the exercises, so that a notebook broken
elsewhere is seen; ``isolation``: ``bubblewrap``, or ``none (--no-sandbox)``).
The grading key (``course.instructor.grading.key``, written by release) gives what the mechanisms cannot: the
questions' answers and the capstone's held-out passages, measured after a checker passed, and the released copy's
lines, which the scan of the source never holds against a student. ``status``
is the checker's (``pass``, ``partial``: a measurement earned part of the points, ``wrong``, ``error``: the
function raised, ``not_done``), or ``forwarded`` (the function uses the course's own implementation of what the
exercise asks for, a shortcut: the feedback names it), ``review`` (correct, but lines the student wrote reach into
the grader: points withheld), ``timeout``, ``not_reached`` (the feedback says why), ``duplicate``, or ``error``
for a notebook that could not be run at all. A submission that cannot be
attributed (see ``course.instructor.grading.submissions``) gets a single row with an empty ``exercise``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import nbformat

import course.exercises  # noqa: F401  (registers every notebook's exercises)
from course.exercises.core import AUTOFILL_ENV, REGISTRY, Exercise
from course.exercises.fixtures import exam
from course.instructor.grading.execution import Run, describe, execute
from course.instructor.grading.gradebook import Gradebook, file_digest, in_order
from course.instructor.grading.isolation import NO_SANDBOX, SANDBOXED, Isolation, kernel_env, walls
from course.instructor.grading.key import GradingKey, measures, read_key
from course.instructor.grading.pool import GradingPool
from course.instructor.grading.remote import (GRADE_PREFIX, CheckResult, CheckServer, check_socket_room,
                                              socket_folder)
from course.instructor.grading.sandbox import Limits
from course.instructor.grading.scan import grader_internals
from course.instructor.grading.shards import Shard, write_record
from course.instructor.grading.stripped import second_checks
from course.instructor.grading.submissions import UNKNOWN_STUDENT, Submission, find_submissions
from course.progress import PROGRESS_ENV
from course.threads import THREADS_ENV

__all__ = ["grade_submission", "grade", "stop_on_signals", "thread_env", "Limits", "NEEDS_KEY"]

NEEDS_KEY = ("question", "capstone")  # exercises graded with what only the key holds
# ----------------------------------------------------------------------------- scoring
def _row(sub: Submission, exercise: str, points: int, max_points: int, status: str, feedback: str,
         digest: str, cells_failed: str = "") -> dict:
    return dict(student=sub.student, notebook=sub.notebook or "", exercise=exercise, points=points,
                max_points=max_points, status=status, feedback=feedback, submission=str(sub.path), sha256=digest,
                cells_failed=cells_failed)


def _check_cell(nb: nbformat.NotebookNode, exercise: str) -> int | None:
    """Index of the first code cell that names the exercise (its check cell)."""
    quoted = (f'"{exercise}"', f"'{exercise}'")
    return next((i for i, c in enumerate(nb.cells)
                 if c.cell_type == "code" and any(q in c.source for q in quoted)), None)


def _why_not_checked(nb: nbformat.NotebookNode, exercise: str, run: Run) -> tuple[str, str]:
    """(status, feedback) for an exercise the grader could not check."""
    check_cell = _check_cell(nb, exercise)
    if check_cell is None:
        return "not_reached", "no cell of the notebook checks this exercise (was its check cell deleted?)"
    where = describe(nb, check_cell)
    outcome = run.cells.get(check_cell)
    if outcome is None:
        return "not_reached", f"not reached: {run.stopped or where + ' was not run'}"
    if outcome.timed_out_after is not None:
        return "timeout", f"timed out after {outcome.timed_out_after} s in {where} (an endless loop?)"
    if outcome.error is not None:
        feedback = f"not reached: {where} raised {outcome.error}"
        first = min(i for i, o in run.cells.items() if o.error is not None)
        if first < check_cell:
            feedback += f"; the first error was in {describe(nb, first)}: {run.cells[first].error}"
        return "not_reached", feedback
    return "not_reached", f"{where} ran but did not hand the function to the grader (was the check call changed?)"


def thread_env(threads: int | None) -> dict[str, str]:
    """The variables that give a kernel ``threads`` torch threads (none: the kernel chooses)."""
    if threads is None:
        return {}
    return {THREADS_ENV: str(threads), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _run_and_check(nb: nbformat.NotebookNode, exercises: list[Exercise], timeout: int, total_timeout: int,
                   limits: Limits, threads: int | None, key: GradingKey,
                   isolation: Isolation | None) -> tuple[Run, dict[str, CheckResult]]:
    with socket_folder(GRADE_PREFIX) as tmp:
        work, control = Path(tmp) / "work", Path(tmp) / "control"
        work.mkdir(mode=0o700)
        control.mkdir(mode=0o700)
        settings = {AUTOFILL_ENV: "0", "COURSE_FAST": "1", PROGRESS_ENV: "off", **thread_env(threads)}
        with CheckServer(control, exercises, timeout, measures(key)) as server:
            env = kernel_env(work, {**server.env(), **settings})  # nobody watches these bars
            run = execute(nb, work, control, env, timeout, total_timeout, limits, isolation)
    return run, second_checks(nb, exercises, server.snapshot(), isolation=isolation, time_limit=timeout, limits=limits,
                              extra_env=settings, measures=measures(key))


def _failed_cells(nb: nbformat.NotebookNode, run: Run) -> str:
    """'cell 12 (`...`): NameError: ...; ...' for every cell that raised (empty when none did)."""
    failed = [f"{describe(nb, i)}: {o.error}" for i, o in sorted(run.cells.items()) if o.error is not None]
    if run.stopped:
        failed.append(f"stopped: {run.stopped}")
    return "; ".join(failed)[:2000]


def grade_submission(sub: Submission, timeout: int = 300, total_timeout: int | None = None,
                     limits: Limits | None = None, threads: int | None = None, *, key: GradingKey,
                     isolation: Isolation | None) -> list[dict]:
    """Execute one submitted notebook and return one row per exercise of its notebook.

    ``timeout``: seconds each cell may run; ``total_timeout``: seconds the whole notebook may run
    (default 6 x ``timeout``); ``limits``: the sandbox's (default: CPU time 2 x ``total_timeout``);
    ``threads``: torch threads of the kernel (default: the notebook chooses); ``key``: the grading key of the
    release the submission was made from (its seed draws the checkers' inputs); ``isolation``: the walls the
    kernel runs in (``find_isolation()``), or None for no walls, which every row records (``isolation``). Never
    raises because of the submission's content.
    """
    with exam(key.seed):  # the checkers draw their inputs for this release
        rows = _grade_rows(sub, timeout, total_timeout, limits, threads, key, isolation)
    for row in rows:
        row["isolation"] = SANDBOXED if isolation is not None else NO_SANDBOX
    return rows


def _grade_rows(sub: Submission, timeout: int, total_timeout: int | None, limits: Limits | None,
                threads: int | None, key: GradingKey, isolation: Isolation | None) -> list[dict]:
    if timeout < 1:
        raise ValueError(f"timeout must be at least 1 second, got {timeout}")
    total_timeout = 6 * timeout if total_timeout is None else total_timeout
    if total_timeout < 1:
        raise ValueError(f"total_timeout must be at least 1 second, got {total_timeout}")
    limits = limits or Limits(cpu_seconds=2 * total_timeout)
    try:
        digest = file_digest(sub.path)
    except OSError as e:
        return [_row(sub, "", 0, 0, "error", f"cannot read this file: {e}", "")]
    exercises = [ex for ex in REGISTRY.values() if sub.notebook and ex.id.startswith(f"{sub.notebook}.")]
    if sub.problem is not None and (sub.student == UNKNOWN_STUDENT or not exercises):
        return [_row(sub, "", 0, 0, "error", f"cannot grade this file: {sub.problem}", digest)]
    if not exercises:
        return [_row(sub, "", 0, 0, "error", f"cannot grade this file: no exercises are registered for notebook "
                                             f"{sub.notebook}", digest)]
    if sub.problem is not None:
        return [_row(sub, ex.id, 0, ex.points, "duplicate", sub.problem, digest) for ex in exercises]
    try:
        nb = nbformat.reads(sub.path.read_text(encoding="utf-8"), as_version=4)
        run, results = _run_and_check(nb, exercises, timeout, total_timeout, limits, threads, key, isolation)
    except Exception as e:  # unreadable notebook or a kernel that would not start
        return [_row(sub, ex.id, 0, ex.points, "error", f"the notebook could not be run: {type(e).__name__}: {e}",
                     digest) for ex in exercises]
    internals = grader_internals(nb, key.released(sub.notebook))
    measured = measures(key)
    failed = _failed_cells(nb, run)
    rows = []
    for ex in exercises:
        result = results.get(ex.id)
        status, feedback = (result.status, result.feedback) if result else _why_not_checked(nb, ex.id, run)
        points = result.points if result else 0  # the check's: all on pass, some on partial, else none
        if ex.kind in NEEDS_KEY and ex.id not in measured:
            status, points = "error", 0
            feedback = "not graded: the grading key holds nothing for this exercise (release again with --key)"
        if status in ("pass", "partial") and internals:
            status, points = "review", 0
            feedback = ("correct, but lines you wrote reach into the grader, points withheld until reviewed: "
                        + "; ".join(internals[:3]))
        rows.append(_row(sub, ex.id, points, ex.points, status, feedback, digest, failed))
    return rows


def _ready_to_grade(key: Path, sandbox: bool | Isolation,
                    paths: list[str | Path]) -> tuple[GradingKey, Isolation | None]:
    """What is checked before anything is graded: the key, the walls, and room for the kernels' sockets."""
    grading_key = read_key(key)
    isolation = walls(sandbox, key, paths)
    check_socket_room()
    return grading_key, isolation


def grade(paths: list[str | Path], timeout: int = 300, total_timeout: int | None = None, layout: str = "folders",
          limits: Limits | None = None, gradebook: Gradebook | None = None,
          progress: Callable[[str], None] | None = None, stop: threading.Event | None = None, jobs: int = 1,
          threads: int | None = None, shard: Shard | None = None, *, key: Path,
          sandbox: bool | Isolation = True, similarity: bool = True) -> list[dict]:
    """Grade every submission found under ``paths`` (with ``shard``, only that shard's); with ``gradebook``, skip
    the unchanged submissions it already holds and write it after each submission (and, with ``shard``, the shard's
    record beside it). Returns the rows in the gradebook's order (the gradebook's, when given).

    ``jobs``: submissions graded at once (each in its own grading process when more than one), each kernel with
    ``threads`` torch threads; the rows do not depend on either. ``key``: the grading key file that release wrote (read
    before anything is graded). ``sandbox``: every kernel inside its own walls
    (``course.instructor.grading.isolation``, or the ``Isolation`` given); ``IsolationUnavailable`` before anything is
    graded when they cannot be set up here, or when the key or a submission folder would be inside what the kernels
    see; ``RuntimeError`` when ``TMPDIR`` leaves no room for their sockets; False grades without walls (trusted
    submissions only; every row says so). ``stop``: set by a signal handler; the submission being graded then is not
    recorded, whatever its interrupted run returned, and ``KeyboardInterrupt`` is raised. ``similarity``: with
    ``gradebook`` and without ``shard``, write the similarity report of every submission found (graded now or kept)
    beside the gradebook when grading ends (``course.instructor.grading.similarity``; ``gradebook merge --key`` writes
    a sharded class's)."""
    if not sys.platform.startswith("linux"):
        raise ValueError("grading needs Linux (the sandbox uses prctl and /proc): run it in a Linux container or VM")
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    grading_key, isolation = _ready_to_grade(key, sandbox, paths)
    mine = [sub for sub in find_submissions(paths, layout) if shard is None or shard.holds(sub)]
    if shard is not None and gradebook is not None:
        write_record(gradebook.folder, shard, [str(p) for p in paths], layout, mine, complete=False)
    todo = []
    for sub in mine:
        if gradebook is not None and sub.path.is_file() and gradebook.graded(str(sub.path), file_digest(sub.path)):
            if progress:
                progress(f"{sub.path}: unchanged since it was graded, kept")
        else:
            todo.append(sub)
    rows: list[dict] = []
    jobs = min(jobs, len(todo))
    with ExitStack() as stack:
        if jobs <= 1:
            finished = ((sub, grade_submission(sub, timeout, total_timeout, limits, threads, key=grading_key,
                                               isolation=isolation))
                        for sub in _announce(todo, progress))
        else:
            finished = stack.enter_context(GradingPool(jobs, timeout, total_timeout, limits, threads, key,
                                                       isolation)).grade(todo, progress)
        for sub, new in finished:
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            rows += new
            if gradebook is not None:
                gradebook.replace(str(sub.path), new)
    if shard is not None and gradebook is not None:
        write_record(gradebook.folder, shard, [str(p) for p in paths], layout, mine, complete=True)
    if similarity and gradebook is not None and shard is None:
        from course.instructor.grading.similarity import Entry, write_similarity

        write_similarity(gradebook.folder, [Entry(sub.student, sub.notebook, sub.path) for sub in mine
                                            if sub.problem is None and sub.notebook], grading_key)
    return gradebook.rows if gradebook is not None else in_order(rows)


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """While inside: SIGINT and SIGTERM set the event ``grade`` takes as ``stop`` and raise ``KeyboardInterrupt``
    (once: a second signal must not cut the clean-up short); the previous handlers come back on leaving."""
    import signal

    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        if not stopping.is_set():
            stopping.set()
            raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopping
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _announce(subs: list[Submission], progress: Callable[[str], None] | None) -> Iterator[Submission]:
    for sub in subs:
        if progress:
            progress(f"grading {sub.path} ...")
        yield sub
