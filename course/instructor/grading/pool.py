"""Several submissions at once: ``grade --jobs N`` runs N grading processes, each grading one submission at a time.

Each grading process (``python -m course.instructor.grading.pool_worker SETTINGS``) does exactly what a serial run does
for one submission (``grade_submission``: its own sandboxed kernel, its own check server, the checkers run in its
own process), so one submission's checkers never share torch's global state or threads with another's. It reads
one submission per line on stdin and answers with that submission's rows, one JSON line on stdout. Each kernel,
and the checkers of its process, get ``threads`` torch threads (``COURSE_THREADS``, ``OMP_NUM_THREADS``).

The processes run in their own sessions, so a Ctrl-C at the terminal reaches only the grader, which then stops
them: each one, on SIGTERM, stops its kernel (the sandbox kills everything the kernel started), removes its
temporary folder and exits without answering; an interrupted submission is never recorded. If the grader itself
is killed, every grading process is told (``PR_SET_PDEATHSIG``) and does the same.
"""

from __future__ import annotations

import dataclasses
import json
import selectors
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from course.instructor.grading.isolation import Isolation
from course.instructor.grading.sandbox import Limits
from course.instructor.grading.submissions import Submission

__all__ = ["GradingPool"]

STOP_WAIT = 60.0  # seconds a grading process may take to clean up after SIGTERM before it is killed


def _task(sub: Submission) -> str:
    return json.dumps({"path": str(sub.path), "student": sub.student, "notebook": sub.notebook,
                       "problem": sub.problem}) + "\n"


class GradingPool:
    """``jobs`` grading processes; ``grade(submissions)`` yields each submission with its rows as it finishes.
    Use it as a context manager: leaving the block stops every process (and, with it, its kernel)."""

    def __init__(self, jobs: int, timeout: int, total_timeout: int | None, limits: Limits | None,
                 threads: int | None, key: Path, isolation: Isolation | None) -> None:
        self.settings = json.dumps({"timeout": timeout, "total_timeout": total_timeout, "threads": threads,
                                    "limits": dataclasses.asdict(limits) if limits else None,
                                    "key": str(Path(key).resolve()),
                                    "isolation": isolation.to_json() if isolation is not None else None})
        self.jobs = jobs
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> GradingPool:
        for _ in range(self.jobs):
            self.processes.append(subprocess.Popen(
                [sys.executable, "-m", "course.instructor.grading.pool_worker", self.settings], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True, encoding="utf-8", start_new_session=True))
        return self

    def __exit__(self, kind: type | None, *rest: object) -> None:
        self.close(interrupted=kind is not None)

    def close(self, interrupted: bool) -> None:
        """Let idle processes end (stdin closed) or, when ``interrupted``, stop them all; wait for each."""
        for p in self.processes:
            if p.poll() is None and interrupted:
                p.send_signal(signal.SIGTERM)
            try:
                p.stdin.close()
            except OSError:  # a process that already died leaves a broken pipe
                pass
        for p in self.processes:
            try:
                p.wait(STOP_WAIT)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            p.stdout.close()
        self.processes = []

    def grade(self, submissions: list[Submission],
              progress: Callable[[str], None] | None = None) -> Iterator[tuple[Submission, list[dict]]]:
        """Grade ``submissions``, at most ``jobs`` at once; yields (submission, rows) in the order they finish."""
        todo, busy = deque(submissions), {}
        selector = selectors.DefaultSelector()

        def give(p: subprocess.Popen) -> None:
            sub = todo.popleft()
            if progress:
                progress(f"grading {sub.path} ...")
            try:
                p.stdin.write(_task(sub))
                p.stdin.flush()
            except OSError:
                raise RuntimeError(f"a grading process ended (exit code {p.wait()}) before {sub.path}") from None
            busy[p] = sub

        for p in self.processes:
            selector.register(p.stdout, selectors.EVENT_READ, p)
            if todo:
                give(p)
        try:
            while busy:
                for key, _ in selector.select():
                    p = key.data
                    line = p.stdout.readline()
                    if not line:
                        raise RuntimeError(f"a grading process ended (exit code {p.wait()}) while grading "
                                           f"{busy[p].path}; the gradebook holds every submission graded before")
                    yield busy.pop(p), json.loads(line)
                    if todo:
                        give(p)
        finally:
            selector.close()
