"""Who a submitted notebook belongs to, and which notebook it is: one rule per layout, chosen explicitly.

``--layout folders`` (the default; nbgrader's ``submitted/STUDENT/ASSIGNMENT/...`` fits it): every
PATH given as a folder is a class folder, and a notebook inside it belongs to the student named by
the *first* folder below it (``class/alice/01_kv_cache.ipynb`` and ``class/alice/ps1/01_kv_cache.ipynb``
are alice's). A notebook given directly as a file belongs to the folder holding it. The file name is
never read for a name, so ``bob/alice__01_kv_cache.ipynb`` is refused (it does not start with a
notebook number), not counted for alice.

``--layout flat``: every notebook is ``STUDENT__NN_name.ipynb`` directly inside a PATH folder (or
given as a file); the student is everything before the *last* ``__``. Folders are never read for a
name, so notebooks in subfolders are refused.

Either way the notebook is the two digits the notebook part of the name starts with (``01``), a
student name must match ``NAME_PATTERN`` (letters, digits and ``. _ - @ +``, starting with a letter or
digit; no empty names), and two submissions of one notebook by one student are both refused as
duplicates (nothing is summed).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = ["LAYOUTS", "NAME_PATTERN", "UNKNOWN_STUDENT", "Submission", "find_submissions", "identify"]

LAYOUTS = ("folders", "flat")
NAME_PATTERN = re.compile(r"[^\W_][\w.@+-]*")
UNKNOWN_STUDENT = "(unknown)"  # never a valid name, so it cannot collide with a student
_NUMBER = re.compile(r"(\d{2})(?!\d)")


@dataclass(frozen=True)
class Submission:
    path: Path
    student: str  # UNKNOWN_STUDENT when no valid name could be found
    notebook: str | None  # "01"; None when the file name does not say
    problem: str | None = None  # why it will not be graded


def identify(path: Path, root: Path | None, layout: str) -> Submission:
    """The submission at ``path`` (found under the class folder ``root``, or given directly when None)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    if layout == "folders":
        if root is None:
            student = path.resolve().parent.name
        else:
            parts = path.relative_to(root).parts
            if len(parts) < 2:
                return Submission(path, UNKNOWN_STUDENT, None, "not inside a student's folder: with --layout folders "
                                  "each student's notebooks are in PATH/STUDENT/ (or use --layout flat)")
            student = parts[0]
        name = path.name
    else:
        if root is not None and path.parent != root:
            return Submission(path, UNKNOWN_STUDENT, None, "in a subfolder: with --layout flat every notebook is "
                              "PATH/STUDENT__NN_name.ipynb (or use --layout folders)")
        student, sep, name = path.name.rpartition("__")
        if not sep:
            return Submission(path, UNKNOWN_STUDENT, None, "the file name has no STUDENT__ prefix "
                              "(--layout flat expects STUDENT__NN_name.ipynb)")
    number = _NUMBER.match(name)
    notebook = number.group(1) if number else None
    if not NAME_PATTERN.fullmatch(student):
        return Submission(path, UNKNOWN_STUDENT, notebook,
                          f"the student name {student!r} is not allowed: use letters, digits and . _ - @ + "
                          "(starting with a letter or a digit)")
    if notebook is None:
        hint = " (names like alice__01_... belong to --layout flat)" if "__" in name else ""
        return Submission(path, student, None,
                          f"the file name does not start with a notebook number (e.g. 01_kv_cache.ipynb){hint}")
    return Submission(path, student, notebook)


def _notebooks(folder: Path) -> list[Path]:
    return [f for f in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in f.relative_to(folder).parts]


def find_submissions(paths: list[str | Path], layout: str = "folders") -> list[Submission]:
    """Every notebook named by ``paths`` (files, or class folders searched recursively), sorted by path,
    each with its student and notebook, duplicates marked; ``ValueError`` for a missing path or no notebook."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    found: dict[Path, Submission] = {}
    for p in map(Path, paths):
        if p.is_dir():
            for f in _notebooks(p):
                found.setdefault(f.resolve(), identify(f, p, layout))
        elif p.is_file():
            found.setdefault(p.resolve(), identify(p, None, layout))
        else:
            raise ValueError(f"path {p} does not exist")
    if not found:
        raise ValueError(f"no notebooks (*.ipynb) found in {', '.join(map(str, paths))}")
    by_owner: dict[tuple[str, str], list[Path]] = defaultdict(list)
    for key, sub in found.items():
        if sub.problem is None:
            by_owner[(sub.student, sub.notebook or "")].append(key)
    for (student, notebook), keys in by_owner.items():
        if len(keys) > 1:
            listing = ", ".join(str(found[k].path) for k in sorted(keys))
            for k in keys:
                found[k] = replace(found[k], problem=f"duplicate: {student} has {len(keys)} submissions of notebook "
                                                     f"{notebook} ({listing}); keep one and grade again")
    return [found[k] for k in sorted(found)]
