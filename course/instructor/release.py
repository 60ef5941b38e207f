"""Student copies of the solution notebooks: ``python -m course release [--check]``.

Every ``notebooks/NN_*.ipynb`` (the solution version) becomes ``notebooks/student/NN_*.ipynb``:
in every cell, each region from a ``### BEGIN SOLUTION`` line to its ``### END SOLUTION`` line
(both included) becomes ``raise NotImplementedError()`` in code cells (at the indentation of the
BEGIN line) and ``YOUR ANSWER HERE`` in markdown and raw cells (in markdown, text in backticks is
quoted code, not a marker); outputs and execution counts are cleared; a banner cell (id
``student-version``) is added at the top; everything else (cell ids, tags such as ``parameters`` and
``colab``) is kept. The output depends only on the solution notebook and the answer key beside it, so releasing twice writes
identical bytes, and ``--check`` can tell whether the committed student copies are up to date.

The questions' answers live in ``answer_key.py`` beside the solution notebooks (release checks them against the
solution cells). Each question's check cell gets, by default, its answer and hints encoded as ``key="..."`` (a
student practising is told whether an answer is right); with ``hidden_answers`` it gets ``answers="hidden"`` and
says only whether an answer is well-formed. With ``key_path`` release also writes the grading key
(``course.instructor.grading.key``): the answers, held-out passages for the capstone drawn now, and the
fingerprints of the released copies' lines (with the solution regions' own lines, for the similarity report).
Keep it from the students; grade with it. A release with a key is an exam of its own: from its seed (secret, kept
in the key) it draws a variant of every question (``course.instructor.variants``: options in an order of their
own, numbers of their own), which its copies show and its key answers.

In the course's repository release also writes the README's table of notebooks from ``course.syllabus``, and
``--check`` reports a solution notebook without a row there, or a row without its notebook
(``course.instructor.syllabus_files``).

Release never destroys: it refuses an output folder that is, or contains, the solution folder; it
only overwrites or deletes a notebook that carries its banner cell (the banner is the record of
what release wrote: a notebook without it is never touched, and release stops, naming it); and it
converts every notebook before writing any.
"""

from __future__ import annotations

import json
import random
import re
import runpy
import secrets
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course.exercises.questions import QUESTIONS, QuestionKey, encode_key
from course.instructor.solutions import is_marker
from course.instructor.syllabus_files import syllabus_problems, write_readme_table

__all__ = ["ReleaseError", "Difference", "strip_solutions", "student_notebook", "release", "check_release",
           "load_answer_key", "ANSWER_KEY", "CAPSTONE_PASSAGES"]

ANSWER_KEY = "answer_key.py"  # beside the solution notebooks
CAPSTONE_PASSAGES = 24  # held-out passages drawn into a grading key

BEGIN, END = "BEGIN SOLUTION", "END SOLUTION"
STUDENT_STUB = "raise NotImplementedError()"
TEXT_STUB = "YOUR ANSWER HERE"
BANNER_ID = "student-version"
SOLUTION_GLOB = "[0-9]*.ipynb"


class ReleaseError(ValueError):
    """A solution notebook cannot be turned into a student copy (the message names file and cell)."""


@dataclass(frozen=True)
class Difference:
    """A student copy that does not match its solution notebook."""

    path: Path
    problem: str  # "differs", "missing", "no solution notebook", or one of ``syllabus_problems``


def strip_solutions(source: str, where: str, cell_type: str = "code") -> str:
    """Replace every solution region of one cell's ``source`` by the stub of its cell type.

    A marker is any line containing ``BEGIN SOLUTION`` or ``END SOLUTION`` (nbgrader's rule; in
    markdown, outside backticks); they must come in pairs, not nested. ``where`` names the cell in
    error messages.
    """
    stub = STUDENT_STUB if cell_type == "code" else TEXT_STUB
    out: list[str] = []
    begin_line: int | None = None
    for number, line in enumerate(source.split("\n"), start=1):
        if is_marker(line, BEGIN, cell_type):
            if begin_line is not None:
                raise ReleaseError(f"{where}: nested '{BEGIN}' at line {number} "
                                   f"(the region opened at line {begin_line} is not closed)")
            if is_marker(line, END, cell_type):
                raise ReleaseError(f"{where}: '{BEGIN}' and '{END}' on the same line {number}")
            begin_line = number
            indent = line[: len(line) - len(line.lstrip())] if cell_type == "code" else ""
            out.append(indent + stub)
        elif is_marker(line, END, cell_type):
            if begin_line is None:
                raise ReleaseError(f"{where}: '{END}' at line {number} without a '{BEGIN}' before it")
            begin_line = None
        elif begin_line is None:
            out.append(line)
    if begin_line is not None:
        raise ReleaseError(f"{where}: '{BEGIN}' at line {begin_line} is never closed by '{END}'")
    return "\n".join(out)


def _banner(solution_name: str) -> nbformat.NotebookNode:
    text = (f"**Student version** of `{solution_name}`, generated from the solution notebook by "
            "`python -m course release` (do not edit this file by hand: edit the solution notebook and "
            "release again).\n\n"
            "Replace each `raise NotImplementedError()` with your code; the cell after each exercise checks it.")
    return nbformat.v4.new_markdown_cell(text, id=BANNER_ID)


_QUESTION_CHECK = re.compile(r'^(\s*\w+\s*=\s*check\("(\d\d\.q_\w+)",\s*\w+,\s*autofill=AUTOFILL)\)\s*$')
_CHUNK = 96  # characters of an encoded key per line


def _with_key(match: re.Match, answers: dict[str, dict]) -> str:
    head, qid = match.group(1), match.group(2)
    if qid not in answers:
        raise ReleaseError(f"{qid}: no entry in the answer key ({ANSWER_KEY})")
    text = encode_key(answers[qid])
    indent = " " * (len(head) - len(head.lstrip()) + 4)
    chunks = [text[i : i + _CHUNK] for i in range(0, len(text), _CHUNK)]
    return head + ",\n" + indent + "key=(" + ("\n" + indent + "     ").join(f'"{c}"' for c in chunks) + "))"


def hide_answers(source: str, answers: dict[str, dict] | None = None) -> str:
    """A question's check cell, rewritten: with ``answers`` (id -> entry) it carries its key (answers shown);
    without, it says only whether the answer is well-formed (answers hidden)."""
    if answers is None:
        return "\n".join(_QUESTION_CHECK.sub(r'\1, answers="hidden")', line) for line in source.split("\n"))
    return "\n".join(_QUESTION_CHECK.sub(lambda m: _with_key(m, answers), line) for line in source.split("\n"))


def student_notebook(solution_text: str, solution_name: str, hidden_answers: bool = False,
                     answers: dict[str, dict] | None = None, keys: dict[str, QuestionKey] | None = None,
                     variants: dict | None = None) -> str:
    """The student copy (serialised, as written to disk) of a solution notebook given as JSON text. The
    questions' checks carry their ``answers`` (id -> key entry), or with ``hidden_answers`` only say whether an
    answer is well-formed (graded use). With the answer key's ``keys`` the questions printed are checked against
    it, and with ``variants`` (id -> ``Variant``) the copy shows each question's variant."""
    try:
        nb = nbformat.v4.reads(solution_text)  # plain JSON: no validation, no ids invented
    except json.JSONDecodeError as e:
        raise ReleaseError(f"{solution_name}: not valid notebook JSON ({e})") from None
    if (nb.get("nbformat"), nb.get("nbformat_minor", 0)) < (4, 5):
        raise ReleaseError(f"{solution_name}: nbformat {nb.get('nbformat')}.{nb.get('nbformat_minor')} has no "
                           "cell ids; save it as nbformat 4.5 or later")
    for number, cell in enumerate(nb.cells, start=1):
        where = f"{solution_name}, cell {number} (id {cell.get('id')})"
        if cell.get("id") == BANNER_ID:
            raise ReleaseError(f"{where}: the id {BANNER_ID!r} is reserved for the banner of the student copy")
        cell.source = strip_solutions(cell.source, where, cell.cell_type)
        if cell.cell_type == "code":
            cell.source = hide_answers(cell.source, None if hidden_answers else answers or {})
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    if keys:
        from course.instructor.variants import VariantError, rewrite_questions

        try:
            rewrite_questions(nb, solution_name, keys, variants)
        except VariantError as e:
            raise ReleaseError(str(e)) from None
    nb.cells.insert(0, _banner(solution_name))
    return nbformat.v4.writes(nb) + "\n"


def _solutions(solution_dir: Path) -> list[Path]:
    if not solution_dir.is_dir():
        raise ReleaseError(f"solution_dir {solution_dir} is not a folder")
    found = sorted(solution_dir.glob(SOLUTION_GLOB))
    if not found:
        raise ReleaseError(f"solution_dir {solution_dir} holds no solution notebooks ({SOLUTION_GLOB})")
    return found


def load_answer_key(solution_dir: Path) -> dict[str, QuestionKey]:
    """The questions' answer key beside the solution notebooks (``answer_key.py``: ``KEY``, a list of
    ``QuestionKey``), checked against the registered questions; ``ReleaseError`` otherwise."""
    path = solution_dir / ANSWER_KEY
    if not path.is_file():
        raise ReleaseError(f"{path}: the questions' answer key is missing (it lives beside the solution notebooks)")
    entries = runpy.run_path(str(path)).get("KEY")
    if not isinstance(entries, list) or not all(isinstance(e, QuestionKey) for e in entries):
        raise ReleaseError(f"{path}: KEY must be a list of QuestionKey")
    keys = {e.id: e for e in entries}
    missing = sorted({q.id for q in QUESTIONS} - set(keys))
    if missing or len(keys) != len(entries):
        raise ReleaseError(f"{path}: every question needs exactly one entry; missing: {', '.join(missing) or '-'}")
    for q in QUESTIONS:
        key = keys[q.id]
        if (q.kind == "choice") != isinstance(key.answer, str) or (q.kind == "choice" and key.answer not in q.options):
            raise ReleaseError(f"{path}: {q.id} is a {q.kind} question, its answer {key.answer!r} is not one")
        if key.answer in key.hints:
            raise ReleaseError(f"{path}: {q.id} has a hint for its own answer {key.answer!r}")
    return keys


def _expected(solution_dir: Path, hidden_answers: bool = False, variants: dict | None = None) -> dict[str, str]:
    keys = load_answer_key(solution_dir) if (solution_dir / ANSWER_KEY).is_file() else {}
    answers = {qid: (variants[qid].entry if variants else key.entry())  # a question without one is refused
               for qid, key in keys.items()}
    return {p.name: student_notebook(p.read_text(encoding="utf-8"), p.name, hidden_answers, answers, keys, variants)
            for p in _solutions(solution_dir)}


def _check_answers_match(solution_dir: Path, keys: dict[str, QuestionKey], variants: dict | None = None) -> None:
    """Every question's solution cell returns the answer key's answer, and with ``variants`` each variant's: on the
    variant's numbers, or re-lettered as its options are (``ReleaseError`` naming the first that does not)."""
    from course.exercises.questions import BY_ID, judge
    from course.instructor.solutions import solution_functions
    from course.instructor.variants import arguments

    for path in _solutions(solution_dir):
        for qid, fn in solution_functions(path).items():
            if qid not in BY_ID:
                continue
            asked = [(keys[qid].entry(), fn, "")]
            variant = (variants or {}).get(qid)
            if variant is not None and variant.numbers is not None:
                numbers = arguments(keys[qid], variant.numbers)
                asked.append((variant.entry, lambda fn=fn, numbers=numbers: fn(**numbers), f" on {numbers}"))
            elif variant is not None and variant.order:
                asked.append((variant.entry, lambda fn=fn, v=variant: v.letter(fn()), f" re-lettered {variant.order}"))
            for entry, answer, how in asked:
                try:
                    judge(BY_ID[qid], entry, answer())
                except AssertionError:
                    raise ReleaseError(f"{path.name}: the solution of {qid} returns {answer()!r}{how}, the answer "
                                       f"key says {entry['answer']!r}") from None


def write_grading_key(solution_dir: Path, copies: dict[str, str], key_path: Path, hidden_answers: bool,
                      seed: int | None = None, passages: int = CAPSTONE_PASSAGES, variants: dict | None = None) -> None:
    """The grading key of this release: answers (each variant's, with ``variants``), ``passages`` held-out passages
    (drawn at random; ``seed`` repeats a draw), the released copies' line fingerprints and the solution regions'
    lines."""
    from course.instructor.grading.key import GradingKey, draw_passages, released_lines, write_key
    from course.instructor.grading.similarity import solution_lines

    keys = load_answer_key(solution_dir)
    _check_answers_match(solution_dir, keys, variants)
    rng = random.Random(seed) if seed is not None else None
    try:
        held_out = draw_passages(passages, rng)
    except FileNotFoundError as e:
        raise ReleaseError(f"the capstone's held-out passages come from the course's texts: {e}") from None
    notebooks = {name[:2]: released_lines(nbformat.reads(text, as_version=4)) for name, text in copies.items()}
    solutions = {p.name[:2]: solution_lines(json.loads(p.read_text(encoding="utf-8")), frozenset(notebooks[p.name[:2]]))
                 for p in _solutions(solution_dir) if p.name[:2] in notebooks}
    answers = {qid: (variants[qid].entry if variants else k.entry()) for qid, k in keys.items()}
    write_key(GradingKey(answers, held_out, notebooks, hidden_answers, solutions, seed=seed), key_path)


def _written_by_release(path: Path) -> bool:
    """Whether ``path`` is a student copy (its first cell is release's banner): the only files release replaces."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
        return nb["cells"][0].get("id") == BANNER_ID
    except (OSError, UnicodeDecodeError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return False


def _refuse_destructive(solution_dir: Path, student_dir: Path, expected: dict[str, str]) -> None:
    solutions, students = solution_dir.resolve(), student_dir.resolve()
    if students == solutions or solutions.is_relative_to(students):
        raise ReleaseError(f"--out {student_dir} is or contains the solution folder {solution_dir}: the solution "
                           "notebooks would be replaced; choose another folder (default: <notebooks>/student)")
    if student_dir.exists() and not student_dir.is_dir():
        raise ReleaseError(f"--out {student_dir} is a file, not a folder")
    foreign = [p for p in (student_dir / name for name in expected) if p.exists() and not _written_by_release(p)]
    if foreign:
        raise ReleaseError(f"--out {student_dir} holds notebooks that release did not write (no student-version "
                           f"banner): {', '.join(p.name for p in foreign)}; move them or choose another folder")


def release(solution_dir: Path, student_dir: Path, hidden_answers: bool = False, key_path: Path | None = None,
            seed: int | None = None, variants: bool = True) -> list[Path]:
    """Write the student copy of every solution notebook; remove student copies whose solution is gone.
    ``hidden_answers``: for graded use, the questions' checks only say whether an answer is well-formed.
    ``key_path``: also write the grading key of this release there, and draw this release's variant of every
    question from ``seed`` (default: a secret one, kept in the key), with the capstone's held-out passages; the same
    seed draws the same exam. ``variants=False``: a key for the notebooks' own questions (copies as self-study has
    them, or the solution notebooks themselves).

    Every notebook is converted, the output folder checked and the key written before any copy is written, so
    a bad marker, an answer key that disagrees with a solution or a destructive ``student_dir`` changes no file.
    Returns the paths written.
    """
    drawn = None
    if key_path is not None:
        from course.instructor.variants import VariantError, draw_variants

        seed = secrets.randbelow(2**32) if seed is None else seed
        try:
            drawn = draw_variants(load_answer_key(solution_dir), seed) if variants else None
        except VariantError as e:
            raise ReleaseError(str(e)) from None
    expected = _expected(solution_dir, hidden_answers, drawn)
    _refuse_destructive(solution_dir, student_dir, expected)
    if key_path is not None:
        if key_path.resolve().is_relative_to(student_dir.resolve()):
            raise ReleaseError(f"--key {key_path} is inside the student folder {student_dir}: the key would be "
                               "handed out with the notebooks; write it elsewhere")
        write_grading_key(solution_dir, expected, key_path, hidden_answers, seed, variants=drawn)
    student_dir.mkdir(parents=True, exist_ok=True)
    for stale in student_dir.glob(SOLUTION_GLOB):
        if stale.name not in expected and _written_by_release(stale):
            stale.unlink()
    written = []
    for name, text in expected.items():
        path = student_dir / name
        path.write_bytes(text.encode("utf-8"))
        written.append(path)
    readme = write_readme_table(solution_dir)
    return written + ([readme] if readme else [])


def check_release(solution_dir: Path, student_dir: Path) -> list[Difference]:
    """Compare the student copies on disk with a fresh release in memory; [] when up to date."""
    expected = _expected(solution_dir)
    problems = []
    for name, text in expected.items():
        path = student_dir / name
        if not path.is_file():
            problems.append(Difference(path, "missing"))
        elif path.read_bytes() != text.encode("utf-8"):
            problems.append(Difference(path, "differs"))
    for path in sorted(student_dir.glob(SOLUTION_GLOB)):
        if path.name not in expected:
            problems.append(Difference(path, "no solution notebook"))
    return problems + [Difference(path, problem) for path, problem in syllabus_problems(solution_dir, SOLUTION_GLOB)]
