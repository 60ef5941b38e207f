"""Copying shows: the similarity report written beside the gradebook (``similarity.csv``, ``.json``, ``.md``).

What is compared. For each notebook number, each student's *written code*: the code lines of the submission whose
fingerprint (``course.instructor.grading.key.line_fingerprint``) is not among the released copy's lines, so that
what the course gave (imports, ``def`` lines, check cells, demonstrations) never counts. Each student's written
code is compared with every other student's for the same notebook, and with the course's public solutions: the
code inside the ``### BEGIN SOLUTION`` / ``### END SOLUTION`` regions of the solution notebooks, which anyone can
read in the course's repository (release stores those lines in the grading key, field ``solutions``; a key
written before that field existed compares the students with one another only).

How. ``copydetect`` (winnowing, as MOSS does): the code is tokenized and every name becomes one letter, so renamed
variables, comments and spacing do not hide a copy; every run of ``NOISE`` characters of that filtered code is a
fingerprint (window 1: copydetect's defaults). Two kinds of fingerprints are left out of the comparisons between
students (not of those with the course's solutions): those that more than ``COMMON`` of the notebook's submissions
share (and more than ``COMMON_MIN`` of them), idioms of the exercise rather than copies (MOSS's ``-m``), and those of
the course's solutions, which the pair with ``"course solutions"`` reports (two students who both pasted the
course's solution are two flags against the course, not a third between them). An inverted index
(fingerprint -> submissions) finds the pairs that share fingerprints at all; only pairs that share at least
``CANDIDATE`` of the smaller one's fingerprints are scored with ``copydetect.compare_files``, so a class of 500
costs seconds, not 125,000 comparisons (``python -m course bench --similarity``).

The score of a pair is directional: ``share_a`` is the fraction of A's written code (filtered characters covered
by fingerprints) that is found in B's, ``share_b`` the converse; ``score`` is the larger of the two, so that a
short submission copied whole into a longer one shows. For the pair with the course's solutions, ``share_a`` is
the fraction of the student's written code that is the course's, ``share_b`` the fraction of the course's
solutions that the student reproduced. A pair is **flagged** when ``score >= THRESHOLD`` and the overlap is at
least ``MIN_OVERLAP`` filtered characters (a two-line submission that shares one idiom is not a copy). Pairs with
a score under ``LISTED`` are not written.

Why ``THRESHOLD = 0.3`` and ``MIN_OVERLAP = 100``. Measured on notebook 01 (the data is
``tests/instructor/similarity_samples.py``): four students' implementations of ``attention_step``,
``generate_greedy``, ``kv_cache_bytes`` and ``kv_bytes_per_token``, written independently in ordinary but different
ways (``torch.cat`` or ``vstack`` or a preallocated tensor, ``softmax`` or an explicit exponential, ``einsum``, a
loop or ``math.prod``), score at most 0.13 against one another (6 pairs; 0.23 before the course's solutions'
fingerprints are left out) and 0.09 to 0.19 against the course's solutions, sharing at most 78 characters: the
forced lines of the exercises and the questions' answers. A copy of one of them with every name renamed, comments
changed and independent lines swapped scores 0.92 against its source; copying one exercise of the four (and writing
the others) scores 0.32 (overlap 118), two 0.55, three 0.83. A student who pastes one of the course's solutions and
writes the other three scores 0.30 to 0.50 against the course's solutions (overlap 117 to 172), two of them 0.59 to
0.74, all of them 1.0. 0.3 keeps a margin of 0.11 above the largest honest score and flags most single copied
exercises of four; the overlap of 100 characters lies between the honest (at most 78) and the copied (at least
117). A class of hundreds has more honest pairs than four students, so a higher honest maximum: the report lists
every pair from ``LISTED`` up, so that a reviewer sees how far the flagged ones stand out. A flag is a reason to
look at the two notebooks side by side, never a verdict: the report changes no grade.

Against the course's solutions, the bar is the notebook's own. Short exercises have one natural way to be written
(``softmax(...) @ V``, ``torch.cat([col, x], dim=1)``), so independent correct code shares lines with the course's
solutions by necessity, more in some notebooks than in others: correct solutions written differently from the
course's (``tests/alternatives``) reach 0.31 in notebook 01, 0.36 in 08 and 0.42 in 04 and 05, over 0.3. ``INDEPENDENT``
holds, per notebook, the highest score such independent solutions reach against the course's
(``independent_similarity.py``, measured by ``python -m tests.alternatives --similarity`` and checked against
the alternatives by the test suite), and a pair with ``"course solutions"`` is flagged only from that score plus
``MARGIN`` (and never below ``THRESHOLD``). ``MARGIN = 0.2`` is the spread of the honest scores against the
course's in notebook 01 (0.09 to 0.31, the samples above and the alternatives): a flag then stands above what
independent work reaches by as much as independent works differ among themselves. The price: a student who
pastes one exercise of four and writes the others (0.30 to 0.50 in notebook 01) is no longer flagged there, two of
four (0.59 to 0.74) still are. The report prints, beside each flag with the course's solutions, what independent
solutions of that notebook score.
"""

from __future__ import annotations

import copy
import csv
import io
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from course.instructor.grading.gradebook import atomic_write, csv_cell
from course.instructor.grading.independent_similarity import INDEPENDENT
from course.instructor.grading.key import GradingKey, line_fingerprint
from course.instructor.solutions import solution_pieces

__all__ = ["COURSE", "THRESHOLD", "MARGIN", "INDEPENDENT", "INDEPENDENT_FILE", "course_threshold", "Pair", "Entry",
           "written_lines", "solution_lines", "written_code", "compare_notebook", "independent_scores",
           "similarity_report", "write_similarity", "format_markdown", "entries_from_rows"]

COURSE = "course solutions"  # student_b of a pair with the course's public solutions
THRESHOLD = 0.3  # see the module's docstring
MIN_OVERLAP = 100  # filtered characters a flagged pair must share
LISTED = 0.15  # pairs scoring under this are not written
NOISE = 25  # characters of filtered code per fingerprint (copydetect's default noise threshold)
WINDOW = 1  # winnowing window (copydetect's defaults: guarantee threshold 25 = noise threshold)
COMMON = 0.2  # a fingerprint in more than this share of a notebook's submissions is an idiom ...
COMMON_MIN = 10  # ... when that is also more than this many submissions
CANDIDATE = 0.1  # share of the smaller side's fingerprints a pair must share to be scored
OVERLAP_LINES = 3  # overlapping lines quoted per pair
LINE_CHARS = 80  # ... each cut to this many characters
FILES = ("similarity.csv", "similarity.json", "similarity.md")
MARGIN = 0.2  # a pair with the course's solutions is flagged from INDEPENDENT[notebook] + MARGIN: see the docstring
INDEPENDENT_FILE = Path(__file__).with_name("independent_similarity.py")
COLUMNS = ("notebook", "student_a", "student_b", "score", "share_a", "share_b", "overlap", "flagged", "lines_a",
           "lines_b", "submission_a", "submission_b")


@dataclass
class Pair:
    """Two submissions of one notebook that share code (``student_b`` may be ``COURSE``)."""

    notebook: str
    student_a: str
    student_b: str
    score: float  # max(share_a, share_b)
    share_a: float  # of A's written code, the fraction found in B's
    share_b: float
    overlap: int  # filtered characters of A's written code found in B's
    flagged: bool
    lines_a: list[str]  # a few of A's lines that B's written code shares
    lines_b: list[str]
    submission_a: str = ""
    submission_b: str = ""
    independent: float | None = None  # with the course's solutions: what independent solutions score (INDEPENDENT)


@dataclass(frozen=True)
class Entry:
    """One submission to compare: who, which notebook, where."""

    student: str
    notebook: str
    path: Path


# ----------------------------------------------------------------------------- written code
def _code_sources(nb: dict) -> Iterable[str]:
    for cell in nb.get("cells", ()) if isinstance(nb, dict) else ():
        if isinstance(cell, dict) and cell.get("cell_type") == "code":
            source = cell.get("source", "")
            yield "".join(source) if isinstance(source, list) else str(source)


def written_lines(nb: dict, released: frozenset[str]) -> list[str]:
    """The code lines of a notebook (as JSON, a dict) that are not in the released copy (``released``: the
    fingerprints the grading key holds), blank lines and IPython magics left out, in notebook order."""
    return [line for source in _code_sources(nb) for line in source.splitlines()
            if line.strip() and not line.lstrip().startswith(("%", "!"))
            and line_fingerprint(line) not in released]


def solution_lines(nb: dict, released: frozenset[str] = frozenset()) -> list[str]:
    """The code lines inside the solution regions of a solution notebook (markers dropped) that are not in the
    released copy: the course's public solutions, as a student would paste them."""
    return [line for source in _code_sources(nb) for piece in solution_pieces(source, "code")
            if isinstance(piece, list) for line in piece if line.strip() and line_fingerprint(line) not in released]


def written_code(path: Path, released: frozenset[str]) -> str | None:
    """The written code of a submitted notebook as one text; None when the file is not a readable notebook."""
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return "\n".join(written_lines(nb, released)) if isinstance(nb, dict) else None


# ----------------------------------------------------------------------------- comparison
def _fingerprint(text: str):
    from copydetect import CodeFingerprint

    return CodeFingerprint("written.py", NOISE, WINDOW, fp=io.StringIO(text), language="python")


def _without(fp, common: set):
    """``fp`` with the ``common`` fingerprints left out (a copy; the original is untouched)."""
    from copydetect.utils import get_token_coverage

    if not common & fp.hashes:
        return fp
    out = copy.copy(fp)
    out.hashes = fp.hashes - common
    out.hash_idx = {h: i for h, i in fp.hash_idx.items() if h not in common}
    out.token_coverage = get_token_coverage(out.hash_idx, fp.k, len(fp.filtered_code))
    return out


def _lines_at(text: str, slices) -> list[str]:
    """The first few lines of ``text`` that the copied ``slices`` (2 x N character ranges) touch."""
    starts, ends = np.asarray(slices[0]), np.asarray(slices[1])
    found, at = [], 0
    for line in text.split("\n"):
        end = at + len(line)
        if np.any((starts < end) & (ends > at)) and line.strip():
            stripped = line.strip()
            found.append(stripped if len(stripped) <= LINE_CHARS else stripped[:LINE_CHARS - 1] + "…")
            if len(found) == OVERLAP_LINES:
                break
        at = end + 1
    return found


def _score(notebook: str, a: str, b: str, fa, fb, threshold: float) -> Pair | None:
    from copydetect import compare_files

    overlap, (share_a, share_b), (slices_a, slices_b) = compare_files(fa, fb)
    share_a, share_b = min(1.0, float(share_a)), min(1.0, float(share_b))
    score = max(share_a, share_b)
    if score < min(LISTED, threshold):
        return None
    return Pair(notebook, a, b, round(score, 3), round(share_a, 3), round(share_b, 3), int(overlap),
                bool(score >= threshold and overlap >= MIN_OVERLAP), _lines_at(fa.raw_code, slices_a),
                _lines_at(fb.raw_code, slices_b))


def _candidates(prints: list) -> list[tuple[int, int]]:
    """The pairs (i < j) of ``prints`` that share at least ``CANDIDATE`` of the smaller one's fingerprints,
    counted through an inverted index (fingerprint -> the submissions holding it)."""
    holders: dict[int, list[int]] = defaultdict(list)
    for i, fp in enumerate(prints):
        for h in fp.hashes:
            holders[h].append(i)
    n = len(prints)
    codes = [np.asarray(ids, dtype=np.int64) for ids in holders.values() if len(ids) > 1]
    if not codes:
        return []
    pair_codes = []
    for ids in codes:
        a, b = np.triu_indices(len(ids), k=1)
        pair_codes.append(ids[a] * n + ids[b])
    pairs, shared = np.unique(np.concatenate(pair_codes), return_counts=True)
    sizes = np.array([len(fp.hashes) for fp in prints])
    i, j = pairs // n, pairs % n
    keep = shared >= CANDIDATE * np.minimum(sizes[i], sizes[j])
    return list(zip(i[keep].tolist(), j[keep].tolist()))


def compare_notebook(notebook: str, texts: dict[str, str], solutions: str = "",
                     threshold: float = THRESHOLD) -> list[Pair]:
    """The pairs of one notebook's written code (``texts``: student -> written code) that score at least
    ``LISTED``, and every student against the course's ``solutions``; highest score first."""
    students = sorted(texts)
    prints = [_fingerprint(texts[s]) for s in students]
    course = _fingerprint(solutions) if solutions.strip() else None
    counts: dict[int, int] = defaultdict(int)
    for fp in prints:
        for h in fp.hashes:
            counts[h] += 1
    limit = max(COMMON * len(prints), COMMON_MIN)
    left_out = {h for h, c in counts.items() if c > limit} | (course.hashes if course is not None else set())
    pruned = [_without(fp, left_out) for fp in prints]
    pairs = []
    for i, j in _candidates(pruned):
        pair = _score(notebook, students[i], students[j], pruned[i], pruned[j], threshold)
        if pair is not None:
            pairs.append(pair)
    if course is not None and course.hashes:
        for student, fp in zip(students, prints):
            if fp.hashes & course.hashes:
                pair = _score(notebook, student, COURSE, fp, course, course_threshold(notebook, threshold))
                if pair is not None:
                    pair.independent = INDEPENDENT.get(notebook)
                    pairs.append(pair)
    return sorted(pairs, key=lambda p: (-p.score, p.student_a, p.student_b))


def course_threshold(notebook: str, threshold: float = THRESHOLD) -> float:
    """The score from which a pair with the course's solutions is flagged in ``notebook``: what independent
    correct solutions reach there (``INDEPENDENT``) plus ``MARGIN``, never below ``threshold``."""
    return round(max(threshold, INDEPENDENT.get(notebook, 0.0) + MARGIN), 3)


def independent_scores(notebook: str, texts: dict[str, str], solutions: str) -> float:
    """The highest score that the written code ``texts`` (independent correct solutions of ``notebook``: name ->
    code) reaches against the course's ``solutions``, however low (no listing cut-off, no flag bar)."""
    course = _fingerprint(solutions)
    prints = [_fingerprint(text) for text in texts.values()]
    pairs = [_score(notebook, "", COURSE, fp, course, 0.0) for fp in prints if fp.hashes & course.hashes]
    return max((p.score for p in pairs if p is not None), default=0.0)


def similarity_report(entries: Iterable[Entry], key: GradingKey, threshold: float = THRESHOLD) -> dict:
    """Every notebook's pairs (``compare_notebook``) of the submissions ``entries``, and what was compared:
    ``{"threshold", "notebooks": {nb: {"submissions", "unreadable", "course_solutions"}}, "pairs": [...]}``."""
    by_notebook: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        by_notebook[entry.notebook].append(entry)
    pairs: list[Pair] = []
    notebooks = {}
    for notebook in sorted(by_notebook):
        released = key.released(notebook)
        texts, paths, unreadable = {}, {}, []
        for entry in sorted(by_notebook[notebook], key=lambda e: (e.student, str(e.path))):
            text = written_code(entry.path, released)
            if text is None:
                unreadable.append(str(entry.path))
            elif entry.student not in texts:
                texts[entry.student], paths[entry.student] = text, str(entry.path)
        solutions = "\n".join(key.solutions.get(notebook, ()))
        found = compare_notebook(notebook, texts, solutions, threshold)
        for pair in found:
            pair.submission_a, pair.submission_b = paths[pair.student_a], paths.get(pair.student_b, "")
        pairs += found
        notebooks[notebook] = {"submissions": len(texts), "unreadable": unreadable,
                               "course_solutions": bool(solutions.strip())}
    return {"threshold": threshold, "min_overlap": MIN_OVERLAP, "listed_from": LISTED, "notebooks": notebooks,
            "pairs": [asdict(p) for p in pairs]}


def entries_from_rows(rows: list[dict]) -> list[Entry]:
    """The submissions a gradebook's rows grade (one entry each), leaving out those that could not be attributed
    or were refused as duplicates."""
    from course.instructor.grading.submissions import UNKNOWN_STUDENT

    seen: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        seen[row["submission"]].append(row)
    return [Entry(r[0]["student"], r[0]["notebook"], Path(path)) for path, r in seen.items()
            if r[0]["notebook"] and r[0]["student"] != UNKNOWN_STUDENT
            and not all(x["status"] == "duplicate" for x in r)]


# ----------------------------------------------------------------------------- files
def _whose(student: str) -> str:
    return "the course's solutions'" if student == COURSE else f"{student}'s"


def format_markdown(report: dict) -> str:
    """The flagged pairs for a reader: one section per pair, its score and the lines they share."""
    flagged = [p for p in report["pairs"] if p["flagged"]]
    counts = ", ".join(f"{nb}: {info['submissions']}" for nb, info in report["notebooks"].items()) or "none"
    lines = ["# Similarity report", "",
             f"Submissions compared per notebook: {counts}. A pair is flagged when its score (the larger share of "
             f"either side's written code found in the other's) is at least {report['threshold']} and they share "
             f"at least {report['min_overlap']} characters of filtered code; a pair with the course's solutions from "
             f"what independent correct solutions of its notebook score against them plus {MARGIN}. A flag asks for "
             "a look at the two notebooks side by side; it changes no grade.", ""]
    missing = [nb for nb, info in report["notebooks"].items() if not info["course_solutions"]]
    if missing:
        lines += [f"Not compared with the course's solutions (the grading key holds none for notebook "
                  f"{', '.join(missing)}: release again with --key).", ""]
    if not flagged:
        lines.append("No pair is flagged.")
    for p in flagged:
        lines += [f"## {p['notebook']}: {p['student_a']} and {p['student_b']}: score {p['score']:.2f}", "",
                  f"{p['share_a']:.0%} of {_whose(p['student_a'])} written code is found in {_whose(p['student_b'])}, "
                  f"{p['share_b']:.0%} of {_whose(p['student_b'])} in {_whose(p['student_a'])}.", ""]
        if p.get("independent") is not None:
            bar = course_threshold(p["notebook"], report["threshold"])
            lines += [f"Independent correct solutions of notebook {p['notebook']} score up to {p['independent']:.2f} "
                      f"against the course's; this pair is flagged from {bar:.2f}.", ""]
        if p["submission_a"]:
            lines += [f"- {p['submission_a']}" + (f"\n- {p['submission_b']}" if p["submission_b"] else ""), ""]
        if p["lines_a"]:
            lines += ["```python", *p["lines_a"], "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_similarity(folder: Path, entries: Iterable[Entry], key: GradingKey, threshold: float = THRESHOLD) -> dict:
    """Write ``similarity.csv``, ``similarity.json`` and ``similarity.md`` into ``folder`` (atomically);
    returns the report."""
    report = similarity_report(entries, key, threshold)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for p in report["pairs"]:
        writer.writerow({k: csv_cell(" | ".join(v) if isinstance(v, list) else v) for k, v in p.items()})
    folder = Path(folder)
    atomic_write(folder / FILES[1], json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    atomic_write(folder / FILES[0], buffer.getvalue())
    atomic_write(folder / FILES[2], format_markdown(report))
    return report
