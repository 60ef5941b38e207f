"""The grading key: what grading needs beyond the course's public mechanisms, kept by the instructor.

``python -m course release --key KEY`` writes it beside the student copies it releases; ``python -m course grade
--key KEY`` reads it. It holds

* the questions' answers and the hints for wrong answers (from the answer key beside the solution notebooks), as
  this release asks them: each question's entry is its variant's, drawn from the release's ``seed`` (kept here),
  its "variant" saying what was drawn (a choice question's options in the order shown, by the letters the notebook
  gives them; a number question's numbers and its text);
* the capstone's held-out passages, drawn at release from the six novels (book and character offset), so that a
  student cannot tune a policy on them;
* a fingerprint of every code line of the released copies, so that the grader judges only what a student wrote or
  changed: lines the course gave are never held against a submission (``course.instructor.grading.scan``);
* the code lines of the solution notebooks' solution regions (the course's public solutions), which the similarity
  report compares every submission with (``course.instructor.grading.similarity``).

Nothing in it is in the installed package. It is plain JSON; keep it where students cannot read it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

__all__ = ["GradingKey", "KeyFileError", "line_fingerprint", "released_lines", "draw_passages", "write_key", "read_key",
           "measures"]

FORMAT = "attention-sinks-course grading key"
VERSION = 2  # 2: the seed, and the questions' variants


class KeyFileError(ValueError):
    """A key file that cannot be used (the message says which file and why)."""


def line_fingerprint(line: str) -> str:
    """A code line's fingerprint: its text without surrounding whitespace, hashed."""
    return hashlib.sha256(line.strip().encode("utf-8")).hexdigest()[:20]


def released_lines(nb: nbformat.NotebookNode) -> list[str]:
    """The fingerprints of every non-blank code line of a released copy (sorted, each once)."""
    lines = {line_fingerprint(line) for cell in nb.cells if cell.cell_type == "code"
             for line in cell.source.splitlines() if line.strip()}
    return sorted(lines)


@dataclass
class GradingKey:
    """questions: exercise id -> ``QuestionKey.entry``; passages: the capstone's [[book, offset], ...];
    notebooks: notebook number -> ``released_lines`` of its released copy; solutions: notebook number -> the code
    lines of its solution regions (absent from keys written before it existed: read as none); seed: the release's
    seed (the variants and the passages it drew)."""

    questions: dict[str, dict] = field(default_factory=dict)
    passages: list[list] = field(default_factory=list)
    notebooks: dict[str, list[str]] = field(default_factory=dict)
    hidden_answers: bool = False
    solutions: dict[str, list[str]] = field(default_factory=dict)
    seed: int | None = None

    def released(self, notebook: str) -> frozenset[str]:
        return frozenset(self.notebooks.get(notebook, ()))


def draw_passages(n: int, rng: secrets.SystemRandom | None = None, margin: int = 20_000) -> list[list]:
    """``n`` held-out passages, [book, character offset], spread over the six novels at random offsets (at least
    ``margin`` characters from either end of a book, where the notebooks take their passages)."""
    from course.data import load_text

    rng = rng or secrets.SystemRandom()
    books = ["emma", "mansfield_park", "northanger_abbey", "persuasion", "pride_and_prejudice",
             "sense_and_sensibility"]
    sizes = {book: len(load_text("austen", book)) for book in books}
    return [[book, rng.randrange(margin, sizes[book] - margin)] for book in (rng.choice(books) for _ in range(n))]


def write_key(key: GradingKey, path: Path) -> None:
    """Write the key as JSON, readable by its owner only, through a temporary file (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"format": FORMAT, "version": VERSION, **asdict(key)}, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def read_key(path: Path) -> GradingKey:
    """The key ``write_key`` wrote; ``KeyFileError`` naming the file otherwise."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise KeyFileError(f"--key {path}: cannot read it ({e.strerror}); `python -m course release --key {path}` "
                        "writes it") from None
    except (ValueError, UnicodeDecodeError):
        raise KeyFileError(f"--key {path}: not a grading key (not JSON)") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise KeyFileError(f"--key {path}: not a grading key written by `python -m course release --key`")
    if data.get("version") != VERSION:
        raise KeyFileError(f"--key {path}: key format version {data.get('version')!r}, this course reads {VERSION}: "
                        "release again")
    try:
        return GradingKey(dict(data["questions"]), list(data["passages"]), dict(data["notebooks"]),
                          bool(data["hidden_answers"]), dict(data.get("solutions", {})), seed=data["seed"])
    except (KeyError, TypeError, ValueError):
        raise KeyFileError(f"--key {path}: a grading key with missing or malformed fields: release again") from None


def measures(key: GradingKey) -> dict[str, Callable]:
    """The grader's measurement of every exercise that needs the key: each question against its answer, the
    capstone on the held-out passages."""
    from course.exercises.questions import BY_ID, answer_measure
    from course.instructor.grading.capstone import capstone_measure

    out: dict[str, Callable] = {qid: answer_measure(BY_ID[qid], entry) for qid, entry in key.questions.items()
                                if qid in BY_ID}
    if key.passages:
        out["07.my_policy"] = capstone_measure([tuple(p) for p in key.passages])
    return out
