"""Every graded release is its own exam: the variant of each question that ``release --key`` draws from its seed.

* A multiple-choice question shows its options in an order of its own: the answer's letter and the letters of the
  hints move with them.
* A number question with a template (``Numbers``, in the answer key) shows numbers of its own: the question's text
  and its function's arguments show them, and its answer and hints are the template's formulas on them.
* Any other question is the notebook's own.

A variant depends only on the seed and the question (each question draws from its own stream), so the same seed
gives the same exam. The questions of self-study copies (release without a key) are the notebooks' own: nothing is
drawn for them. Release checks what it draws: on the notebook's own numbers a template gives the answer key's
answer, hints and text, and the notebook's function's arguments; on the drawn numbers the solution notebook's
answer is the variant's (``course.instructor.release``).
"""

from __future__ import annotations

import inspect
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

import nbformat

from course.exercises.questions import BY_ID, QuestionKey
from course.instructor.solutions import (UNDERSTANDING, exercise_cells, printed_options, question_paragraph,
                                         split_options, understanding)

__all__ = ["Variant", "VariantError", "draw_variants", "draw", "rewrite_questions", "printed_options", "spells",
           "UNDERSTANDING", "TRIES"]

TRIES = 1000  # draws of a number question's parameters before release gives up on its template


class VariantError(ValueError):
    """A question whose template, key and notebook disagree (release reports it as a ``ReleaseError``)."""


@dataclass(frozen=True)
class Variant:
    """A question as one graded release asks it: ``entry``, its grading key's entry (``QuestionKey.entry`` of the
    variant, and under "variant" what was drawn); ``numbers``, a number question's drawn parameters; ``order``, a
    choice question's options, by the letters the notebook gives them, in the order shown."""

    id: str
    entry: dict
    numbers: dict | None = None
    order: str = ""

    def letter(self, original: str) -> str:
        """The letter under which this variant shows the option the notebook prints as ``original``."""
        return "abcde"[self.order.index(original)] if self.order else original


def _call(formula: Callable, values: dict) -> object:
    """``formula`` on the values it names (every value when it takes ``**kwargs``)."""
    parameters = inspect.signature(formula).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return formula(**values)
    return formula(**{name: values[name] for name in parameters})


def _plain(number: float) -> int | float:
    """An answer as the key keeps it: a whole number as an int."""
    number = float(f"{float(number):.12g}")
    return int(number) if number.is_integer() and abs(number) < 2**53 else number


def defaults(key: QuestionKey) -> dict:
    """The parameters of a templated number question as the notebook shows them."""
    return {name: shown for name, (shown, _) in key.numbers.params.items()}


def arguments(key: QuestionKey, values: dict) -> dict:
    """The numbers among ``values``: the arguments of the question's function."""
    return {name: values[name] for name, (shown, _) in key.numbers.params.items() if not isinstance(shown, str)}


def signature_line(function: str, key: QuestionKey, values: dict) -> str:
    """The first line of a templated question's function, its arguments defaulting to ``values``."""
    return f"def {function}(" + ", ".join(f"{n}={v!r}" for n, v in arguments(key, values).items()) + "):"


def template_entry(key: QuestionKey, values: dict) -> tuple[dict, str]:
    """(the key's entry, the question's text) of a templated number question on the parameters ``values``."""
    t = key.numbers
    answer = _plain(_call(t.answer, values))
    texts = list(key.hints.values())
    if len(t.wrong) != len(texts):
        raise VariantError(f"{key.id}: its template has {len(t.wrong)} wrong answers for {len(texts)} hints")
    hints = []
    for spec, text in zip(t.wrong, texts):
        formula, text = (spec if isinstance(spec, tuple) else (spec, text))
        hints.append([_plain(_call(formula, {**values, "answer": answer})),
                      text if isinstance(text, str) else _call(text, values)])
    nudge = key.nudge if t.nudge is None else _call(t.nudge, values)
    entry = {"answer": answer, "nudge": nudge, "hints": hints, "tol": key.tol}
    return entry, _call(t.text, values)


def _same(a: float, b: float, tol: float) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def spells(text: str, number: float) -> bool:
    """Whether ``text`` writes ``number`` out (as 1234, 1,234 or 0.25: a number of its own, not a part of one)."""
    return any(re.search(rf"(?<![\d.,]){re.escape(s)}(?![\d]|[.,]\d)", text)
               for s in {f"{number:g}", f"{number:,}", str(number)})


def _sensible(key: QuestionKey, values: dict, entry: dict, public: float) -> bool:
    """Whether a draw makes a question of its own: valid numbers, an answer that is not the notebook's, hints that
    are told apart from the answer and from each other and do not write the answer out."""
    t, tol, answer = key.numbers, key.tol, entry["answer"]
    if t.valid is not None and not _call(t.valid, values):
        return False
    wrong = [w for w, _ in entry["hints"]]
    if not math.isfinite(answer) or _same(answer, public, tol) or any(_same(w, answer, tol) for w in wrong):
        return False
    if any(_same(a, b, tol) for i, a in enumerate(wrong) for b in wrong[i + 1:]):
        return False
    return not any(spells(text, answer) for text in [entry["nudge"], *(h for _, h in entry["hints"])])


def check_template(key: QuestionKey) -> tuple[dict, str]:
    """A template on the notebook's own numbers gives the answer key's entry (``VariantError`` otherwise);
    returns (that entry, the question's text)."""
    entry, text = template_entry(key, defaults(key))
    public = key.entry()
    if not _same(entry["answer"], float(public["answer"]), key.tol):
        raise VariantError(f"{key.id}: its template gives {entry['answer']!r} on the notebook's numbers, the answer "
                           f"key says {key.answer!r}")
    for (w, h), (pw, ph) in zip(entry["hints"], public["hints"]):
        if not _same(w, float(pw), key.tol) or h != ph:
            raise VariantError(f"{key.id}: its template gives the hint {w!r}: {h!r} on the notebook's numbers, the "
                               f"answer key {pw!r}: {ph!r}")
    if entry["nudge"] != public["nudge"]:
        raise VariantError(f"{key.id}: its template's nudge on the notebook's numbers is not the answer key's")
    return entry, text


def draw(key: QuestionKey, seed: int) -> Variant:
    """The variant of one question that the seed ``seed`` draws."""
    q = BY_ID[key.id]
    rng = random.Random(f"{seed}:{key.id}")
    if q.kind == "choice":
        order = list(q.options)
        rng.shuffle(order)
        variant = Variant(key.id, {}, order="".join(order))
        entry = {**key.entry(), "answer": variant.letter(key.answer),
                 "hints": [[variant.letter(w), h] for w, h in key.hints.items()], "variant": {"order": variant.order}}
        return Variant(key.id, entry, order=variant.order)
    if key.numbers is None:
        return Variant(key.id, key.entry())
    public, _ = check_template(key)
    for _ in range(TRIES):
        values = {name: rng.choice(list(drawn)) for name, (_, drawn) in key.numbers.params.items()}
        entry, text = template_entry(key, values)
        if _sensible(key, values, entry, public["answer"]):
            entry["variant"] = {"numbers": values, "question": text}
            return Variant(key.id, entry, numbers=values)
    raise VariantError(f"{key.id}: {TRIES} draws of its template gave no question of its own (answer or hints "
                       "clash): widen its ranges")


def draw_variants(keys: dict[str, QuestionKey], seed: int) -> dict[str, Variant]:
    """The variant of every question that the seed ``seed`` draws."""
    return {qid: draw(key, seed) for qid, key in keys.items()}


# ----------------------------------------------------------------------------- the notebooks' side
def rewrite_questions(nb: nbformat.NotebookNode, name: str, keys: dict[str, QuestionKey],
                      variants: dict[str, Variant] | None = None) -> None:
    """Check that the notebook prints every question as its key has it (a choice question's options; a templated
    number question's text, and its function's arguments, on the notebook's numbers), and with ``variants`` show
    each variant instead: its options in its order, its numbers. ``VariantError`` names the question otherwise."""
    cell = understanding(nb)
    for qid, ex in exercise_cells(nb).items():
        q, key = BY_ID.get(qid), keys.get(qid)
        if q is None or key is None or (q.kind != "choice" and key.numbers is None):
            continue
        where = f"{name}, {qid}"
        number = int(ex.name[1:]) if re.fullmatch(r"q\d+", ex.name) else None
        m = question_paragraph(cell.source, number) if cell is not None and number is not None else None
        if m is None:
            raise VariantError(f"{where}: its function {ex.name}() has no paragraph '**N.** ...' under "
                               f"'{UNDERSTANDING}' (the question's text)")
        variant = (variants or {}).get(qid)
        if q.kind == "choice":
            parsed = split_options(m.group(1))
            if parsed is None or "".join(parsed[1]) != q.options:
                raise VariantError(f"{where}: its paragraph must end with its options on one line, "
                                   f"'(a) ...  (b) ...', one for each of {', '.join(q.options)}")
            head, options = parsed
            if key.choices and tuple(options.values()) != key.choices:
                raise VariantError(f"{where}: the options printed are not the answer key's choices")
            if variant is not None:
                shown = "  ".join(f"({new}) {options[old]}" for new, old in zip("abcde", variant.order))
                cell.source = cell.source[:m.start(1)] + head + "\n" + shown + cell.source[m.end(1):]
            continue
        _, text = check_template(key)
        if m.group(1) != text:
            raise VariantError(f"{where}: the question printed is not its template's text on the notebook's numbers:"
                               f"\n  printed:  {m.group(1)!r}\n  template: {text!r}")
        code = nb.cells[ex.solution]
        line = signature_line(ex.name, key, defaults(key))
        if line not in code.source.split("\n"):
            raise VariantError(f"{where}: its function must take the question's numbers as arguments: {line}")
        if variant is not None:
            drawn = variant.numbers
            cell.source = cell.source[:m.start(1)] + _call(key.numbers.text, drawn) + cell.source[m.end(1):]
            code.source = "\n".join(signature_line(ex.name, key, drawn) if s == line else s
                                    for s in code.source.split("\n"))
