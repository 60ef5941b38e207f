"""Scientific claims that a notebook asserts about the model that ran, and the rows of the reproduction table.

A notebook's mechanics (a cached decode equals a full forward, the cache holds what its policy keeps)
hold for any weights and are plain ``assert``s. Its *findings* (the first token is a sink, a window
without sinks collapses) are claims about trained models. ``claim`` asserts them on trained weights,
and on an untrained model (``ModelConfig.random_weights``, e.g. ``gpt2-random``, which the course uses
to run every notebook through the GPT-2 code paths offline) prints and records them without raising:

    claim(collapse >= 5, "evicting the first tokens makes perplexity explode", model)

Three kinds of row, kept apart (``docs/reproductions.md`` counts only the first):

* **reproduction** (``reproduction``): the paper's own quantity re-measured in the paper's setting (the row's
  ``scale`` states the setting), scaled down and said so; a different quantity, or the paper's quantity in a
  setting the paper did not use, is an illustration or the course's finding. The row holds the paper result (a key of ``course.papers.RESULTS``), the paper's number, the notebook's
  values (one per passage, seed, prompt or repetition), the scale it ran at, and a ``Rule`` (its value, why, the
  commit it was fixed in and the runs it was set on: ``docs/thresholds.md``) that turns the values into a
  verdict: *reproduced*, *partly*, *not reproduced at this scale*, or *inconclusive at n = ...*;
* **illustration** (``illustration``): true by construction, a different quantity than the paper's, or the
  paper's quantity in another setting. Shown
  beside the paper's number, never given a verdict, never counted;
* **the course's own finding** (``finding``, ``report``): a statement no paper measured, judged by a rule the
  course fixed: *holds*, *does not hold*, or *inconclusive at n = ...*. Never "reproduced".

Uncertainty. A verdict is judged on an interval, never on a point (``course.stats.interval``): for a median the
order-statistic interval of at least 95 % coverage (exact for any continuous distribution; the range of 6 to 8
values, the 2nd smallest to the 2nd largest from 9), for a mean a nominal 95 % bootstrap interval; every interval
prints its coverage. A verdict needs ``MIN_FOR_CLAIM`` (5) values: from 2 to 4 it is *inconclusive at n = ...*
whatever the values, the reason saying where they lie. A threshold is checked on the exploration split and asserted
on the confirmation split (``course.splits``, ``python -m course explore``); most were first set on runs that were
also the asserted runs, so fresh draws, data drawn after the rules and read by no one before (``python -m course
reproduce --fresh SEED``), say which verdicts hold beyond the data they were chosen on. *Reproduced* needs the
whole interval to clear the rule's threshold; an interval that straddles a threshold is *inconclusive at n =
...* (raise n in the full run rather than lower the bar). Every row carries its n.

    COLLAPSE = Rule("window only / 4 sinks, median over passages", at_least=10, partly=2,
                    why="the paper's effect is a collapse: an order of magnitude, not a few percent")
    reproduction("02", "streamingllm.table1", "5158.07 / 5.40 = 955x", collapses.values, COLLAPSE, model,
                 scale=f"{N_PASSAGES} passages of {TOKENS} tokens, window {WINDOW}")

A row is never asserted: a result that does not reproduce is a finding, reported with its numbers
(``claim`` asserts what the notebook teaches). Each notebook ends with ``show_reproductions("02")``, which
prints its rows and stores them in the cell's output (MIME type ``REPRODUCTION_MIME``);
``python -m course reproductions`` reads them from the executed notebooks and writes
``docs/reproductions.md``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from course.stats import MIN_FOR_CLAIM, Interval, interval

__all__ = ["ClaimFailed", "Claim", "claim", "report", "RECORDED", "Rule", "Reproduction", "reproduction",
           "illustration", "finding", "REPRODUCTIONS", "show_reproductions", "REPRODUCTION_MIME", "VERDICTS",
           "KINDS", "REPRODUCTION", "ILLUSTRATION", "FINDING", "verdict_class", "recording", "provenance", "CLAIMS_ENV"]


class ClaimFailed(AssertionError):
    """A finding the notebook expects of a trained model did not hold."""


@dataclass(frozen=True)
class Claim:
    """A claim checked, not asserted (random weights, or an exploration run): what it says, whether it held,
    and the figure it was judged on, where the notebook gives one."""

    statement: str
    held: bool
    model: str
    figure: float | None = None


RECORDED: list[Claim] = []
CLAIMS_ENV = "COURSE_CLAIMS"  # "record": claims are recorded, not asserted (an exploration run)


def recording() -> bool:
    """Whether claims are recorded instead of asserted: ``COURSE_CLAIMS=record`` (``python -m course explore``
    sets it; anything else but unset or "assert" is refused)."""
    import os

    value = os.environ.get(CLAIMS_ENV, "").strip() or "assert"
    if value not in ("assert", "record"):
        raise ValueError(f"{CLAIMS_ENV} must be 'assert' or 'record' (or unset: assert), got {value!r}")
    return value == "record"


def claim(holds: bool, statement: str, model, figure: float | None = None) -> bool:
    """Assert ``statement`` (``holds`` says whether it is true) about ``model`` (a course model or its config);
    ``figure``: the number the statement was judged on (recorded by an exploration run).

    Trained weights: raises ``ClaimFailed`` when it does not hold. Random weights, or ``COURSE_CLAIMS=record``:
    prints whether it held, records it in ``RECORDED`` and returns. Returns ``holds``."""
    config = getattr(model, "config", model)
    holds = bool(holds)
    random_weights = getattr(config, "random_weights", False)
    if not random_weights and not recording():
        if not holds:
            raise ClaimFailed(f"{config.name}: {statement}")
        return holds
    RECORDED.append(Claim(statement, holds, config.name, None if figure is None else float(figure)))
    verdict = "holds" if holds else "does not hold"
    why = "has random weights" if random_weights else "in an exploration run"
    shown = "" if figure is None else f" (figure {float(figure):.4g})"
    print(f"[{config.name} {why}: claim recorded, not asserted] {statement} -- {verdict}{shown}")
    return holds


REPRODUCTION_MIME = "application/vnd.course.reproductions+json"
REPRODUCTION, ILLUSTRATION, FINDING = "reproduction", "illustration", "finding"
KINDS = (REPRODUCTION, ILLUSTRATION, FINDING)
REPRODUCED, PARTLY, NOT_REPRODUCED = "reproduced", "partly", "not reproduced at this scale"
INCONCLUSIVE = "inconclusive"          # printed with its n: "inconclusive at n = 4"
HOLDS, DOES_NOT_HOLD = "holds", "does not hold"
SHOWN = "illustration: shown, not counted"
VERDICTS = (REPRODUCED, PARTLY, INCONCLUSIVE, NOT_REPRODUCED)   # a reproduction row's verdicts, as tallied


def verdict_class(verdict: str) -> str:
    """The verdict a row's text belongs to ("inconclusive at n = 4" -> "inconclusive")."""
    return INCONCLUSIVE if verdict.startswith(INCONCLUSIVE) else verdict


@dataclass(frozen=True)
class Rule:
    """How measured values become a verdict (``docs/thresholds.md`` gives when it was fixed, on which runs).

    Exactly one of ``at_least`` / ``at_most``: the ``statistic`` ("median" or "mean") of the measured values
    reproduces the paper when its whole interval (``course.stats.interval``) is at least (at most) that value,
    and partly when the whole interval reaches ``partly`` (``partly`` lies below ``at_least``, or above
    ``at_most``). An interval across a threshold is inconclusive. ``why`` says why these thresholds are the
    effect sizes that matter."""

    quantity: str
    at_least: float | None = None
    at_most: float | None = None
    partly: float | None = None
    why: str = ""
    statistic: str = "median"

    def __post_init__(self):
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError(f"Rule {self.quantity!r}: give exactly one of at_least= or at_most=")
        if self.partly is not None and (self.partly > self.at_least if self.at_least is not None
                                        else self.partly < self.at_most):
            raise ValueError(f"Rule {self.quantity!r}: partly={self.partly} must be looser than the threshold")
        if self.statistic not in ("median", "mean"):
            raise ValueError(f"Rule {self.quantity!r}: statistic must be 'median' or 'mean', got {self.statistic!r}")

    @property
    def threshold(self) -> float:
        return self.at_least if self.at_least is not None else self.at_most

    @property
    def text(self) -> str:
        """The rule as written: the quantity, its thresholds and why."""
        up = self.at_least is not None
        sign = ">=" if up else "<="
        partly = f"; partly: {sign} {self.partly:g}" if self.partly is not None else ""
        return f"{self.quantity} {sign} {self.threshold:g}{partly}" + (f" ({self.why})" if self.why else "")

    def judge(self, measured) -> tuple[str, str, Interval]:
        """``(verdict, reason, interval)`` for ``measured`` (a number, or one value per passage, seed, prompt or
        repetition). The verdict is one of ``VERDICTS``, inconclusive written with its n."""
        try:
            iv = interval(measured, self.statistic)
        except (TypeError, ValueError):  # None, NaN or no value: nothing was measured
            nan = float("nan")
            return (NOT_REPRODUCED, f"{self.quantity}: no number was measured",
                    Interval(nan, nan, nan, 0, "none", self.statistic))
        up = self.at_least is not None
        sign, miss = (">=", "<") if up else ("<=", ">")
        bounds = [self.threshold] + ([self.partly] if self.partly is not None else [])

        def level(x: float) -> int:  # 2: clears the threshold, 1: clears partly, 0: neither
            return next((2 - i for i, b in enumerate(bounds) if (x >= b if up else x <= b)), 0)

        cautious, hopeful = (iv.low, iv.high) if up else (iv.high, iv.low)
        lo, hi = level(cautious), level(hopeful)
        at = f"{self.quantity} = {iv.point:.3g}"
        if iv.n > 1:
            at += f" ({iv.how} {iv.low:.3g} to {iv.high:.3g}, n = {iv.n})"
        whole = "" if iv.n == 1 else "the whole interval "
        if lo != hi:
            straddled = " and ".join(f"{b:g}" for b in bounds if iv.low <= b <= iv.high)
            return f"{INCONCLUSIVE} at n = {iv.n}", f"{at}: the interval straddles {straddled}", iv
        if lo == 2:
            verdict, where = REPRODUCED, f"{sign} {self.threshold:g}"
        elif lo == 1:
            verdict, where = PARTLY, f"{sign} {self.partly:g} but {miss} {self.threshold:g}"
        else:
            verdict, where = NOT_REPRODUCED, f"{miss} {bounds[-1]:g}"
        if 1 < iv.n < MIN_FOR_CLAIM:  # the range of so few values covers the median too rarely for a verdict
            return (f"{INCONCLUSIVE} at n = {iv.n}", f"{at}: {whole}{where}, but a verdict needs {MIN_FOR_CLAIM} "
                    f"values (the range of {iv.n} covers the median {iv.coverage:.0%} of the time)", iv)
        return verdict, f"{at}: {whole}{where}", iv

    def verdict(self, measured) -> tuple[str, str]:
        """``(verdict, reason)`` for ``measured`` (``judge`` without the interval)."""
        verdict, reason, _ = self.judge(measured)
        return verdict, reason


@dataclass(frozen=True)
class Reproduction:
    """One row of the reproduction table (``docs/reproductions.md``): a reproduction, an illustration or the
    course's own finding (``kind``)."""

    notebook: str
    result: str | None  # a key of course.papers.RESULTS (None: the course's own finding)
    source: str         # "Xiao et al. (2023, arXiv 2309.17453), Table 1"
    quantity: str
    paper: str          # the paper's number for the quantity, with how it follows from the table
    measured: float     # the statistic of the values (median or mean), or the one value
    model: str
    scale: str          # what ran: tokens, passages, seeds, window
    verdict: str
    reason: str
    rule: str           # the rule, as written before the run ("" for an illustration)
    kind: str = REPRODUCTION
    n: int = 1          # how many values (passages, seeds, prompts, repetitions) the verdict rests on
    low: float | None = None    # the interval the verdict was judged on
    high: float | None = None
    interval: str = "one value"  # which interval (course.stats): "range", "order-statistic interval", "one value"


REPRODUCTIONS: list[Reproduction] = []


def _config(model):
    config = getattr(model, "config", model)
    if isinstance(config, str):  # a row about arithmetic on published configurations, no model run
        from types import SimpleNamespace

        config = SimpleNamespace(name=config)
    return config


def _record(row: Reproduction) -> Reproduction:
    key = (row.notebook, row.kind, row.result, row.quantity)
    REPRODUCTIONS[:] = [r for r in REPRODUCTIONS if (r.notebook, r.kind, r.result, r.quantity) != key] + [row]
    return row


def reproduction(notebook: str, result: str, paper: str, measured, rule: Rule, model, scale: str,
                 limit: str | None = None) -> Reproduction:
    """Record how ``measured`` (this run's values: one per passage, seed, prompt or repetition, or one number)
    compares with the paper's (``paper``, a text such as ``"5158.07 / 5.40 = 955x"``) under ``rule``. ``result``
    names the published result in ``course.papers``; ``limit``, when given, says why this run cannot reproduce
    more than partly (e.g. a stream far shorter than the paper's) and caps the verdict there. ``model`` is the
    course model that ran (or its config), or a plain name where no model ran. Returns the row (also kept in
    ``REPRODUCTIONS``)."""
    from course.papers import result as paper_result

    source = paper_result(result).source
    config = _config(model)
    verdict, reason, iv = rule.judge(measured)
    if limit and verdict == REPRODUCED:
        verdict, reason = PARTLY, f"{reason}, but {limit}"
    if getattr(config, "random_weights", False):
        reason += " (random weights: no trained behaviour to reproduce)"
    return _record(Reproduction(notebook, result, source, rule.quantity, paper, iv.point, config.name, scale,
                                verdict, reason, "reproduced: " + rule.text, REPRODUCTION, iv.n, iv.low, iv.high,
                                iv.how))


def illustration(notebook: str, result: str, paper: str, measured, quantity: str, model, scale: str,
                 why: str, statistic: str = "median") -> Reproduction:
    """Record a number shown beside a paper's that is not a reproduction: true by construction, or a different
    quantity than the paper's (``why`` says which). It gets no verdict and is never counted."""
    from course.papers import result as paper_result

    iv = interval(measured, statistic)
    return _record(Reproduction(notebook, result, paper_result(result).source, quantity, paper, iv.point,
                                _config(model).name, scale, SHOWN, why, "", ILLUSTRATION, iv.n, iv.low, iv.high,
                                iv.how))


def finding(notebook: str, statement: str, measured, rule: Rule, model, scale: str,
            source: str = "the course's own (no paper measured it)") -> Reproduction:
    """Record the course's own finding (no paper measured it): ``rule`` (no ``partly``) judges ``measured`` as
    for a reproduction, and the verdict reads *holds*, *does not hold* or *inconclusive at n = ...*. Prints the
    line and returns the row."""
    if rule.partly is not None:
        raise ValueError(f"a finding holds or does not: its rule {rule.quantity!r} takes no partly=")
    config = _config(model)
    verdict, reason, iv = rule.judge(measured)
    verdict = {REPRODUCED: HOLDS, NOT_REPRODUCED: DOES_NOT_HOLD}.get(verdict, verdict)
    if getattr(config, "random_weights", False):
        reason += " (random weights)"
    row = _record(Reproduction(notebook, None, source, statement, "-", iv.point, config.name, scale, verdict,
                               reason, "holds: " + rule.text, FINDING, iv.n, iv.low, iv.high, iv.how))
    RECORDED.append(Claim(statement, verdict == HOLDS, config.name))
    print(f"{config.name}: {statement} -- {verdict} ({reason})")
    return row


def provenance(notebook: str, rows: list[Reproduction]) -> dict:
    """What a notebook stores with its rows: the rows, the split it ran on, every draw of data it made
    (``course.splits.DRAWN``) and the claims it recorded instead of asserting."""
    from course.splits import current_split, drawn

    return {"notebook": notebook, "rows": [asdict(r) for r in rows], "split": current_split(),
            "claims_recorded": recording(), "drawn": drawn(), "claims": [asdict(c) for c in RECORDED]}


def show_reproductions(notebook: str) -> list[Reproduction]:
    """Print this notebook's rows, the three kinds apart, and put them, machine-readable, in the cell's output.
    Returns them."""
    rows = [r for r in REPRODUCTIONS if r.notebook == notebook]
    titles = {REPRODUCTION: "Reproductions (a paper's quantity, measured here)",
              ILLUSTRATION: "Illustrations (shown beside a paper's number, not counted)",
              FINDING: "The course's own findings (no paper)"}
    lines = [f"Rows recorded by notebook {notebook} ({len(rows)}):"]
    for kind, title in titles.items():
        mine = [r for r in rows if r.kind == kind]
        if not mine:
            continue
        lines.append(f"{title}:")
        for r in mine:
            if r.low is None:  # a yes/no finding (report)
                measured = f"{'yes' if r.measured else 'no'} (n = {r.n})"
            else:
                measured = f"{r.measured:.3g} (n = {r.n}" + (f", {r.interval} {r.low:.3g} to {r.high:.3g})"
                                                               if r.n > 1 else ")")
            if kind == FINDING:
                lines.append(f"- {r.quantity}. Here: {measured} on {r.model} ({r.scale}). {r.verdict} -- {r.reason}.")
            else:
                lines.append(f"- {r.source}: {r.quantity}. Paper: {r.paper}. Here: {measured} on {r.model} "
                             f"({r.scale}). " + (f"Verdict: {r.verdict} -- {r.reason}." if kind == REPRODUCTION
                                                 else f"Not a reproduction: {r.reason}."))
    if not rows:
        lines.append("- none")
    text = "\n".join(lines)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # plain Python
        print(text)
        return rows
    if get_ipython() is None:
        print(text)
    else:
        display({"text/plain": text, REPRODUCTION_MIME: provenance(notebook, rows)}, raw=True)
    return rows


def report(holds: bool, statement: str, model, numbers: str, notebook: str | None = None, n: int | None = None,
           scale: str = "") -> bool:
    """The course's own finding, given as a yes/no: print ``statement`` with this run's ``numbers`` and whether it
    holds, record it in ``RECORDED`` (and, with ``notebook``, as a finding row resting on ``n`` values) and return
    ``holds``. Never asserts, and never says "reproduced": no paper measured it (``finding`` judges a number
    with its interval; this is for a statement already reduced to yes or no by a rule fixed before the run)."""
    config = _config(model)
    holds = bool(holds)
    verdict = HOLDS if holds else DOES_NOT_HOLD
    RECORDED.append(Claim(statement, holds, config.name))
    if notebook is not None:
        _record(Reproduction(notebook, None, "the course's own (no paper measured it)", statement, "-",
                             float(holds), config.name, scale, verdict, numbers, "", FINDING, n or 1, None, None,
                             "yes or no"))
    print(f"{config.name}: {statement} -- {verdict} ({numbers})")
    return holds
