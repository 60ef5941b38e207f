"""Check your understanding: short questions per notebook, answered by a function that returns the answer.

A question is an exercise like any other (same registry, same ``check``, same grader): the student writes a
function that returns the answer, a letter for a multiple-choice question or a number, and
``check("02.q_first_eviction", answer, autofill=AUTOFILL)`` checks it, calling it without arguments (a number
question's function takes the question's numbers as arguments with defaults, ``def q1(window=64):``). Under the
grader only the returned value crosses (plain data).

This module knows the questions' form only (a letter among the options, or a number): the answers and the hints
for wrong answers are the instructor's (``QuestionKey``, in the answer key beside the solution notebooks). Release
copies them into the grading key, and, unless the answers are hidden, into each question's check cell as an
encoded ``key="..."`` argument, so that a student practising alone is told whether an answer is right and gets
the hint that names the misconception, never the answer.
"""

from __future__ import annotations

import base64
import json
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from course.exercises.core import Exercise, ExerciseFailed, NotDoneYet, Wrong, exercise

__all__ = ["Question", "QuestionKey", "Numbers", "QUESTIONS", "normalise_choice", "form_problem", "judge", "encode_key",
           "decode_key", "answer_measure", "check_question"]

CHOICES = "abcde"
KEY_PREFIX = "k1:"


@dataclass(frozen=True)
class Question:
    """One question's public side: its id, title and the form of its answer ("choice": a letter among
    ``options``; "number")."""

    id: str  # "<notebook>.q_<name>"
    title: str
    kind: str
    options: str = "abcd"


@dataclass(frozen=True)
class Numbers:
    """A number question as a template, from which a graded release draws its own numbers (``course.instructor
    .variants``). Every formula is a function of the parameters it names (``answer`` too, in ``wrong``).

    * ``params``: name -> (the value the notebook shows, the values a graded release may draw). A number is also an
      argument of the question's function (``def q1(layers=12, ...)``), so that an answer computed from the
      arguments answers every variant; a text (a model's name) appears in the question only.
    * ``answer``: the answer, by the formula the course teaches.
    * ``text``: the question as the notebook prints it after its number.
    * ``wrong``: one per hint of the ``QuestionKey``, in its order: the typical wrong answer (``lambda answer:
      answer / 2`` for a forgotten factor 2), or (that, the hint's text) when the text names the question's numbers.
    * ``nudge``: the nudge, when it names the question's numbers; ``valid``: whether drawn numbers make sense
      together.
    """

    params: dict
    answer: Callable
    text: Callable
    wrong: tuple = ()
    nudge: Callable | None = None
    valid: Callable | None = None


@dataclass(frozen=True)
class QuestionKey:
    """The instructor's side of a question: the answer (a letter or a number, ``tol`` the relative tolerance),
    ``hints`` (a typical wrong answer -> what is wrong with it), ``nudge`` (the hint for any other wrong answer)
    and the options' text as the notebook prints them (``choices``, for the notebooks' tests); for a number question
    whose numbers a graded release draws, its template (``numbers``)."""

    id: str
    answer: str | float
    nudge: str
    hints: dict = field(default_factory=dict)
    tol: float = 1e-9
    choices: tuple[str, ...] = ()
    numbers: Numbers | None = None

    def entry(self) -> dict:
        """The key's entry for this question (plain JSON)."""
        return {"answer": self.answer, "nudge": self.nudge, "hints": [[k, v] for k, v in self.hints.items()],
                "tol": self.tol}


def normalise_choice(value: object) -> str | None:
    """'b', 'B', ' (b) ', 'b)' -> 'b'; anything that is not one letter -> None."""
    if not isinstance(value, str):
        return None
    letter = value.strip().strip("()").strip().rstrip(")").strip().lower()
    return letter if len(letter) == 1 and letter in CHOICES else None


def _as_number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:  # a 0-d tensor or numpy number
        import torch

        t = torch.as_tensor(value)
        return float(t) if t.dim() == 0 and t.dtype != torch.bool else None
    except (TypeError, ValueError, RuntimeError):
        return None


def _same(a: float, b: float, tol: float) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def form_problem(q: Question, got: object) -> str | None:
    """Why ``got`` is not a well-formed answer to ``q`` (None when it is: a letter among the options, or a
    number)."""
    if q.kind == "choice":
        letter = normalise_choice(got)
        if letter is None or letter not in q.options:
            return f"answer with one letter among {', '.join(q.options)} (a string such as \"a\"), got {got!r}"
        return None
    number = _as_number(got)
    return f"answer with a number, got {got!r}" if number is None or math.isnan(number) else None


def judge(q: Question, entry: dict, got: object) -> None:
    """Raise ``Wrong`` with the matching hint unless ``got`` is the key's answer (``entry``: ``QuestionKey.entry``)."""
    problem = form_problem(q, got)
    if problem:
        raise Wrong(problem)
    hints = [(wrong, hint) for wrong, hint in entry.get("hints", [])]
    if q.kind == "choice":
        letter = normalise_choice(got)
        if letter != entry["answer"]:
            raise Wrong(next((h for wrong, h in hints if wrong == letter), entry["nudge"]))
        return
    number, tol = _as_number(got), float(entry.get("tol", 1e-9))
    if _same(number, float(entry["answer"]), tol):
        return
    raise Wrong(next((h for wrong, h in hints if not isinstance(wrong, str) and _same(number, float(wrong), tol)),
                     entry["nudge"]))


def encode_key(entry: dict) -> str:
    """A question's key entry as the text release writes into its check cell (answers shown)."""
    raw = zlib.compress(json.dumps(entry, sort_keys=True).encode("utf-8"), 9)
    return KEY_PREFIX + base64.b64encode(raw).decode("ascii")


def decode_key(text: str) -> dict:
    """The entry ``encode_key`` wrote; ``ValueError`` for anything else."""
    try:
        if not isinstance(text, str) or not text.startswith(KEY_PREFIX):
            raise ValueError
        entry = json.loads(zlib.decompress(base64.b64decode(text[len(KEY_PREFIX):], validate=True)))
        if not isinstance(entry, dict) or "answer" not in entry or "nudge" not in entry:
            raise ValueError
        return entry
    except (ValueError, zlib.error, TypeError):
        raise ValueError("key must be the text `python -m course release` wrote into this check cell; release the "
                         "notebooks again") from None


def answer_measure(q: Question, entry: dict) -> Callable[[Callable], None]:
    """The grader's measurement of a question: the answer against the key's entry."""

    def measure(fn: Callable) -> None:
        judge(q, entry, fn())

    return measure


def check_question(ex: Exercise, fn: Callable, autofill: bool, key: str | None) -> Callable:
    """``check`` for a question in a notebook: right or wrong with the key the cell carries; only whether the
    answer is well-formed without one (answers hidden: the grader decides)."""
    q = BY_ID[ex.id]
    try:
        got = fn()
    except NotImplementedError:
        if autofill:
            print(f"⚠ {ex.title}: not answered yet, AUTOFILL is on.")
            return fn
        raise NotDoneYet(f"{ex.title} is not answered yet: replace `raise NotImplementedError()` with your answer "
                         "(or set AUTOFILL = True in the parameters cell to run on).") from None
    try:
        if key is None:
            problem = form_problem(q, got)
            if problem:
                raise Wrong(problem)
            print(f"✓ {ex.title}: answer recorded (well-formed); the grader decides whether it is right.")
            return fn
        judge(q, decode_key(key), got)
    except Wrong as e:
        raise ExerciseFailed(f"✗ {ex.title}: {e}") from None
    print(f"✓ {ex.title}: correct.")
    return fn


def _form_checker(q: Question) -> Callable[[Callable], None]:
    def check_form(fn: Callable) -> None:
        problem = form_problem(q, fn())
        if problem:
            raise Wrong(problem)

    return check_form


QUESTIONS: list[Question] = [
    Question("01.q_bytes_per_token", "Question 1 (bytes per token)", "number"),
    Question("01.q_gqa_factor", "Question 2 (what GQA saves)", "number"),
    Question("01.q_what_grows", "Question 3 (what grows with the context)", "choice"),
    Question("01.q_exact", "Question 4 (what the cache changes)", "choice"),
    Question("02.q_first_eviction", "Question 1 (when the collapse starts)", "number"),
    Question("02.q_why_collapse", "Question 2 (why evicting the first token hurts)", "choice"),
    Question("02.q_renormalise", "Question 3 (where the sink's share goes)", "number"),
    Question("02.q_newlines", "Question 4 (what makes a sink)", "choice"),
    Question("03.q_positions_seen", "Question 1 (positions inside the cache)", "choice"),
    Question("03.q_what_changes", "Question 2 (what re-assigning changes)", "choice"),
    Question("03.q_rerotate", "Question 3 (re-rotating a key)", "number"),
    Question("03.q_gpt2", "Question 4 (why GPT-2 cannot re-assign)", "choice"),
    Question("03.q_stream_bytes", "Question 5 (memory after a long stream)", "number"),
    Question("04.q_raw_sums", "Question 1 (why raw sums favour old tokens)", "choice"),
    Question("04.q_queries_per_key", "Question 2 (how many queries see a key)", "number"),
    Question("04.q_uniform_mass", "Question 3 (what sparse means)", "number"),
    Question("04.q_gqa_group", "Question 4 (scores per KV head)", "number"),
    Question("05.q_question_at_end", "Question 1 (why the question goes last)", "choice"),
    Question("05.q_prefix_kept", "Question 2 (capacity bookkeeping)", "number"),
    Question("05.q_pooling", "Question 3 (why pool the votes)", "choice"),
    Question("05.q_vote_rows", "Question 4 (who votes for a KV head)", "number"),
    Question("06.q_sink_logit", "Question 1 (what a sink logit replaces)", "choice"),
    Question("06.q_sink_weight", "Question 2 (a softmax with a sink)", "number"),
    Question("06.q_targets", "Question 3 (what the loss counts)", "number"),
    Question("06.q_off_by_one", "Question 4 (the off-by-one softmax)", "number"),
    Question("07.q_one_at_a_time", "Question 1 (why one token at a time)", "choice"),
    Question("07.q_memory_ratio", "Question 2 (memory saved)", "number"),
    Question("07.q_recall", "Question 3 (which policy can recall)", "choice"),
    Question("07.q_heavy_slots", "Question 4 (a budget's share)", "number"),
    Question("08.q_bytes_per_token", "Question 1 (bytes of a 2-bit token)", "number"),
    Question("08.q_full_tokens", "Question 2 (what stays in full precision)", "number"),
    Question("08.q_sinks_exact", "Question 3 (why keep the sink exact)", "choice"),
    Question("09.q_duo_slots", "Question 1 (a DuoAttention cache's slots)", "number"),
    Question("09.q_shared_slots", "Question 2 (what Ada-KV shares)", "number"),
    Question("09.q_random_control", "Question 3 (why the control avoids the best heads)", "choice"),
]
BY_ID: dict[str, Question] = {q.id: q for q in QUESTIONS}

for _q in QUESTIONS:
    exercise(_q.id, _q.title, points=1, kind="question")(_form_checker(_q))
