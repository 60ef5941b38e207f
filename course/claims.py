"""Scientific claims that a notebook asserts about the model that ran.

A notebook's mechanics (a cached decode equals a full forward, the cache holds what its policy keeps)
hold for any weights and are plain ``assert``s. Its *findings* (the first token is a sink, a window
without sinks collapses) are claims about trained models. ``claim`` asserts them on trained weights,
and on an untrained model (``ModelConfig.random_weights``, e.g. ``gpt2-random``, which the course uses
to run every notebook through the GPT-2 code paths offline) prints and records them without raising:

    claim(collapse >= 5, "evicting the first tokens makes perplexity explode", model)

Reproductions. Where a notebook re-runs a published result it records one row with ``reproduction``: the
paper result (a key of ``course.papers.RESULTS``, which holds the published numbers), the paper's number for
the quantity compared, the notebook's own number, the scale it ran at, and a ``Rule`` written in the notebook
*before* the run that turns the measured number into a verdict — ``reproduced``, ``partly`` or ``not
reproduced at this scale`` — with the reason:

    COLLAPSE = Rule("window only / 4 sinks, median over passages", at_least=10, partly=2,
                    why="the paper's effect is a collapse: an order of magnitude, not a few percent")
    reproduction("02", "streamingllm.table1", "5158.07 / 5.40 = 955x", collapses.median, COLLAPSE, model,
                 scale=f"{N_PASSAGES} passages of {TOKENS} tokens, window {WINDOW}")

A row is never asserted: a result that does not reproduce is a finding, reported with its numbers
(``claim`` asserts what the notebook teaches). Each notebook ends with ``show_reproductions("02")``, which
prints its rows and stores them in the cell's output (MIME type ``REPRODUCTION_MIME``);
``python -m course reproductions`` reads them from the executed notebooks and writes
``docs/reproductions.md``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["ClaimFailed", "Claim", "claim", "report", "RECORDED", "Rule", "Reproduction", "reproduction", "REPRODUCTIONS",
           "show_reproductions", "REPRODUCTION_MIME", "VERDICTS"]


class ClaimFailed(AssertionError):
    """A finding the notebook expects of a trained model did not hold."""


@dataclass(frozen=True)
class Claim:
    """A claim checked on an untrained model: what it says and whether it held."""

    statement: str
    held: bool
    model: str


RECORDED: list[Claim] = []


def claim(holds: bool, statement: str, model) -> bool:
    """Assert ``statement`` (``holds`` says whether it is true) about ``model`` (a course model or its config).

    Trained weights: raises ``ClaimFailed`` when it does not hold. Random weights: prints whether it held,
    records it in ``RECORDED`` and returns. Returns ``holds``."""
    config = getattr(model, "config", model)
    holds = bool(holds)
    if not getattr(config, "random_weights", False):
        if not holds:
            raise ClaimFailed(f"{config.name}: {statement}")
        return holds
    RECORDED.append(Claim(statement, holds, config.name))
    verdict = "holds" if holds else "does not hold"
    print(f"[{config.name} has random weights: claim recorded, not asserted] {statement} -- {verdict}")
    return holds


REPRODUCTION_MIME = "application/vnd.course.reproductions+json"
REPRODUCED, PARTLY, NOT_REPRODUCED = "reproduced", "partly", "not reproduced at this scale"
VERDICTS = (REPRODUCED, PARTLY, NOT_REPRODUCED)


@dataclass(frozen=True)
class Rule:
    """How a measured number becomes a verdict, fixed before the run.

    Exactly one of ``at_least`` / ``at_most``: the measured ``quantity`` reproduces the paper when it is at
    least (at most) that value, and partly when it reaches ``partly`` (``partly`` lies below ``at_least``, or
    above ``at_most``). ``why`` says why these thresholds are the effect sizes that matter."""

    quantity: str
    at_least: float | None = None
    at_most: float | None = None
    partly: float | None = None
    why: str = ""

    def __post_init__(self):
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError(f"Rule {self.quantity!r}: give exactly one of at_least= or at_most=")
        if self.partly is not None and (self.partly > self.at_least if self.at_least is not None
                                        else self.partly < self.at_most):
            raise ValueError(f"Rule {self.quantity!r}: partly={self.partly} must be looser than the threshold")

    def verdict(self, measured: float) -> tuple[str, str]:
        """``(verdict, reason)`` for ``measured``."""
        if measured is None or (isinstance(measured, float) and math.isnan(measured)):
            return NOT_REPRODUCED, f"{self.quantity}: no number was measured"
        up = self.at_least is not None
        full = self.at_least if up else self.at_most
        ok = (lambda t: measured >= t) if up else (lambda t: measured <= t)
        sign, miss = (">=", "<") if up else ("<=", ">")
        if ok(full):
            return REPRODUCED, f"{self.quantity} = {measured:.3g} {sign} {full:g}"
        if self.partly is not None and ok(self.partly):
            return PARTLY, f"{self.quantity} = {measured:.3g}: {sign} {self.partly:g} but {miss} {full:g}"
        bound = self.partly if self.partly is not None else full
        return NOT_REPRODUCED, f"{self.quantity} = {measured:.3g} {miss} {bound:g}"


@dataclass(frozen=True)
class Reproduction:
    """One row of the reproduction table (``docs/reproductions.md``)."""

    notebook: str
    result: str        # a key of course.papers.RESULTS
    source: str        # "Xiao et al. (2023, arXiv 2309.17453), Table 1"
    quantity: str
    paper: str         # the paper's number for the quantity, with how it follows from the table
    measured: float
    model: str
    scale: str         # what ran: tokens, passages, seeds, window
    verdict: str
    reason: str
    rule: str          # the rule, as written before the run


REPRODUCTIONS: list[Reproduction] = []


def reproduction(notebook: str, result: str, paper: str, measured: float, rule: Rule, model, scale: str,
                 limit: str | None = None) -> Reproduction:
    """Record how ``measured`` (this run's number) compares with the paper's (``paper``, a text such as
    ``"5158.07 / 5.40 = 955x"``) under ``rule``. ``result`` names the published result in ``course.papers``;
    ``limit``, when given, says why this run cannot reproduce more than partly (e.g. a stream shorter than the
    trained context) and caps the verdict there. ``model`` is the course model that ran (or its config), or a plain
    name where no model ran (arithmetic on published configurations). Returns the row (also kept in
    ``REPRODUCTIONS``)."""
    from course.papers import result as paper_result

    source = paper_result(result).source
    config = getattr(model, "config", model)
    if isinstance(config, str):  # a row about arithmetic on published configurations, no model run
        from types import SimpleNamespace

        config = SimpleNamespace(name=config)
    verdict, reason = rule.verdict(float(measured))
    if limit and verdict == REPRODUCED:
        verdict, reason = PARTLY, f"{reason}, but {limit}"
    if getattr(config, "random_weights", False):
        reason += " (random weights: no trained behaviour to reproduce)"
    bound = f">= {rule.at_least:g}" if rule.at_least is not None else f"<= {rule.at_most:g}"
    partly = f"; partly: {'>=' if rule.at_least is not None else '<='} {rule.partly:g}" if rule.partly is not None \
        else ""
    text = f"reproduced: {rule.quantity} {bound}{partly}" + (f" ({rule.why})" if rule.why else "")
    row = Reproduction(notebook, result, source, rule.quantity, paper, float(measured), config.name, scale, verdict,
                       reason, text)
    REPRODUCTIONS[:] = [r for r in REPRODUCTIONS if (r.notebook, r.result, r.quantity) !=
                        (notebook, result, rule.quantity)] + [row]
    return row


def show_reproductions(notebook: str) -> list[Reproduction]:
    """Print this notebook's rows and put them, machine-readable, in the cell's output. Returns them."""
    rows = [r for r in REPRODUCTIONS if r.notebook == notebook]
    lines = [f"Reproductions recorded by notebook {notebook} ({len(rows)}):"]
    for r in rows:
        lines.append(f"- {r.source}: {r.quantity}. Paper: {r.paper}. Here: {r.measured:.3g} on {r.model} "
                     f"({r.scale}). Verdict: {r.verdict} -- {r.reason}.")
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
        display({"text/plain": text, REPRODUCTION_MIME: {"notebook": notebook, "rows": [asdict(r) for r in rows]}},
                raw=True)
    return rows


def report(holds: bool, statement: str, model, numbers: str) -> bool:
    """Check a published finding without asserting it: print ``statement`` with this run's ``numbers`` and the
    verdict, "reproduced" or "not reproduced at this scale", record it in ``RECORDED`` and return ``holds``.

    For a paper's result that a small model or a short run may honestly miss; ``holds`` must come from a
    threshold fixed before the run (the smallest effect worth teaching), never from the numbers it checks."""
    config = getattr(model, "config", model)
    holds = bool(holds)
    RECORDED.append(Claim(statement, holds, config.name))
    verdict = "reproduced" if holds else "not reproduced at this scale"
    print(f"{config.name}: {statement} -- {verdict} ({numbers})")
    return holds
