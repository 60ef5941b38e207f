"""The gradebook: ``gradebook.json`` and ``gradebook.csv``, rewritten atomically after every submission.

Its rows are always in one order, the submissions' paths (compared folder by folder), each submission's
rows in the order of its notebook's exercises: so the gradebook does not depend on the order in which
submissions finished (one grader or several at once, one run or several, one machine or shards merged).
Every row carries the SHA-256 of the submission it grades, so a second run with the same ``--out``
keeps the rows of unchanged submissions instead of grading them again (``--regrade`` grades
everything). Each file is written to a temporary name in the same folder and renamed over the old
one, so an interrupted run leaves the previous complete version, never half a file. CSV cells that a
spreadsheet would read as a formula (starting with ``= + - @``, a tab or a carriage return) are
prefixed with an apostrophe; the JSON file keeps the exact text.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import tempfile
from pathlib import Path

__all__ = ["COLUMNS", "GradebookError", "Gradebook", "csv_cell", "file_digest", "atomic_write", "read_rows", "in_order",
           "totals", "format_gradebook"]

COLUMNS = ("student", "notebook", "exercise", "points", "max_points", "status", "feedback", "submission", "sha256",
           "cells_failed", "isolation")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class GradebookError(ValueError):
    """The output folder cannot hold a gradebook (the message names it and says why)."""


def csv_cell(value: object) -> object:
    """``value`` made safe for a spreadsheet: text that would start a formula gets a leading apostrophe."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def in_order(rows: list[dict]) -> list[dict]:
    """``rows`` in the gradebook's order: by submission path, folder by folder (stable: each submission's
    rows keep their order)."""
    return sorted(rows, key=lambda r: Path(r["submission"]).parts)


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_rows(folder: Path, what: str = "--out") -> list[dict]:
    """The rows of the gradebook in ``folder`` (none when it has no ``gradebook.json``); ``GradebookError``
    naming ``what`` (the parameter that gave the folder) when the file is not a gradebook."""
    path = Path(folder) / "gradebook.json"
    if not path.exists():
        return []
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GradebookError(f"{what} {folder}: {path.name} is not a readable gradebook ({e}); "
                             "move it away or choose another folder") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and set(COLUMNS) <= set(r) for r in rows):
        raise GradebookError(f"{what} {folder}: {path.name} is not a gradebook of this version "
                             "(missing columns); move it away or choose another folder (grade --regrade starts over)")
    return rows


class Gradebook:
    """The gradebook in ``folder``: checked before any grading, then updated submission by submission."""

    def __init__(self, folder: Path, regrade: bool = False) -> None:
        self.folder = Path(folder)
        if self.folder.exists() and not self.folder.is_dir():
            raise GradebookError(f"--out {self.folder} is a file, not a folder: give a folder for the gradebook")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            probe = tempfile.NamedTemporaryFile(dir=self.folder, prefix=".write-test-")
            probe.close()
        except OSError as e:
            raise GradebookError(f"--out {self.folder} cannot be written to ({e.strerror or e})") from None
        self.json_path, self.csv_path = self.folder / "gradebook.json", self.folder / "gradebook.csv"
        self.rows: list[dict] = [] if regrade else in_order(read_rows(self.folder))

    def graded(self, submission: str, digest: str) -> bool:
        """Whether the gradebook already holds rows for this exact submission (same path, same bytes)."""
        return any(r["submission"] == submission and r["sha256"] == digest for r in self.rows)

    def replace(self, submission: str, rows: list[dict]) -> None:
        """Put ``rows`` in place of the submission's old rows and write both files."""
        self.rows = in_order([r for r in self.rows if r["submission"] != submission] + rows)
        self.write()

    def write(self) -> None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: csv_cell(v) for k, v in r.items()} for r in self.rows)
        atomic_write(self.json_path, json.dumps(self.rows, indent=1, ensure_ascii=False) + "\n")
        atomic_write(self.csv_path, buffer.getvalue())


def totals(rows: list[dict]) -> list[dict]:
    """Points and maximum per student, in order of first appearance."""
    out: dict[str, dict] = {}
    for r in rows:
        t = out.setdefault(r["student"], {"student": r["student"], "points": 0, "max_points": 0})
        t["points"] += r["points"]
        t["max_points"] += r["max_points"]
    return list(out.values())


def format_gradebook(rows: list[dict]) -> str:
    """The rows as an aligned table, followed by each student's total."""
    header = ("student", "nb", "exercise", "points", "status", "feedback")
    table = [header] + [(r["student"], r["notebook"], r["exercise"] or "-", f"{r['points']}/{r['max_points']}",
                         r["status"], r["feedback"]) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in table]
    lines.append("")
    lines += [f"total {t['student']}: {t['points']}/{t['max_points']}" for t in totals(rows)]
    return "\n".join(lines)
