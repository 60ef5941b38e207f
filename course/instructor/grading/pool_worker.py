"""One grading process of ``grade --jobs N`` (``python -m course.instructor.grading.pool_worker SETTINGS``, started
by ``course.instructor.grading.pool.GradingPool``): it grades the submissions named on stdin, one per line, as a
serial run would (``grade_submission``), and answers each with its rows, one JSON line on stdout. On SIGTERM, or
when the grader dies (``PR_SET_PDEATHSIG``), it stops its kernel and exits without answering.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from pathlib import Path

from course.instructor.grading.sandbox import PR_SET_PDEATHSIG, Limits
from course.instructor.grading.submissions import Submission

__all__ = ["main"]


def _die_with_parent() -> None:
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the grader died before the signal was armed
        sys.exit(0)


def main(argv: list[str] | None = None) -> int:
    """Grade the submissions named on stdin, one per line; answer each with its rows on stdout."""
    stopping = []

    def stop(signum: int, frame: object) -> None:
        if not stopping:  # a second signal must not cut the clean-up short
            stopping.append(signum)
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the grader decides when to stop
    _die_with_parent()
    settings = json.loads((argv or sys.argv[1:])[0])
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # whatever else prints goes to stderr, never into the answers

    import torch

    from course.instructor.grading.grade import grade_submission
    from course.instructor.grading.isolation import Isolation
    from course.instructor.grading.key import read_key

    if settings["threads"]:
        torch.set_num_threads(settings["threads"])
    limits = Limits(**settings["limits"]) if settings["limits"] else None
    key = read_key(Path(settings["key"]))
    isolation = Isolation.from_json(settings["isolation"]) if settings["isolation"] else None
    try:
        while line := sys.stdin.readline():
            task = json.loads(line)
            sub = Submission(Path(task["path"]), task["student"], task["notebook"], task["problem"])
            rows = grade_submission(sub, settings["timeout"], settings["total_timeout"], limits, settings["threads"],
                                    key=key, isolation=isolation)
            if stopping:  # interrupted: whatever the run returned is not a grade
                return 130
            answers.write(json.dumps(rows, ensure_ascii=False) + "\n")
            answers.flush()
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
