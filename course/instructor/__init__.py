"""The instructor's toolchain, apart from what students read: grading, release, the site and its hosting,
notebook times, output checks and benchmarks.

Students open ``course`` for the mechanisms (models, the cache, policies, evaluation) and ``course.exercises``
for the checkers of their exercises; nothing here is imported by a notebook. Every tool is a command of
``python -m course`` (``grade``, ``gradebook``, ``release``, ``site``, ``host``, ``bench``, ``check-outputs``);
the grading machinery needs the ``instructor`` extra (``pip install "attention-sinks-course[instructor]"``).
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRA", "require"]

EXTRA = 'pip install "attention-sinks-course[instructor]"'


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or a module set to None
        return False


def require(command: str, *modules: str) -> None:
    """Before ``command`` starts: ``RuntimeError`` in one line, naming what is missing and the extra that
    brings it, unless every one of ``modules`` can be imported."""
    missing = [m for m in modules if not _installed(m)]
    if missing:
        raise RuntimeError(f"`python -m course {command}` needs the instructor's tools ({', '.join(missing)} "
                           f"not installed): {EXTRA}")
