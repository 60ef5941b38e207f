"""The fresh draws beside the notebooks' own runs, for ``python -m course reproductions``: reading
``docs/fresh/<SEED>/<notebook>.json`` (written by ``python -m course reproduce --fresh SEED``,
``course.instructor.fresh_draws``), matching their rows and claims to the notebooks' (``row_key``), saying whether
a verdict held on every draw (``agreement``), the page's "Fresh draws" section (``summary``) and
``docs/fresh-draws.md`` (``render_draws``). The ``page`` these take is ``course.instructor.reproductions``' page: its
columns by name (``by``), its rows in order (``order``), the draws (``draws``, ``seeds``, ``fresh``) and the column
they are judged against (``own``). How a row and a cell are written (``value_text``, ``cell_text``) is shared with
that page.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from course.claims import FINDING, HOLDS, ILLUSTRATION, PARTLY, REPRODUCED

__all__ = ["FRESH_DIR", "Agreement", "read_draws", "row_key", "draw_rows", "draw_claims", "agreement", "summary",
           "render_draws", "cell_text", "value_text"]

FRESH_DIR = Path(__file__).resolve().parents[2] / "docs" / "fresh"


def cell_text(text) -> str:
    """``text`` as one markdown table cell (pipes escaped, on one line)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def value_text(r: dict) -> str:
    """A row's number with its n and interval: ``1.22 [1.1 to 1.4, range], n = 6``."""
    if r.get("low") is None and r["kind"] == FINDING:  # a yes/no finding (course.claims.report)
        return f"{'yes' if r['measured'] else 'no'}, n = {r['n']}"
    if r["n"] > 1 and r.get("low") is not None:
        return f"{r['measured']:.3g} [{r['low']:.3g} to {r['high']:.3g}, {r['interval']}], n = {r['n']}"
    return f"{r['measured']:.3g}, n = {r['n']}"


def read_draws(folder: Path | str = FRESH_DIR) -> dict[int, dict[str, dict]]:
    """Every fresh draw written under ``folder``: ``{seed: {notebook stem: record}}`` (none: {})."""
    folder = Path(folder)
    draws: dict[int, dict[str, dict]] = {}
    for sub in sorted(folder.iterdir() if folder.is_dir() else [], key=lambda p: p.name):
        if sub.is_dir() and sub.name.isdigit():
            records = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(sub.glob("*.json"))}
            if records:
                draws[int(sub.name)] = records
    return draws


def row_key(notebook: str, row: dict) -> tuple[str, str, str]:
    """How a row is matched across runs: its notebook's number, its kind and its quantity."""
    return notebook[:2], row["kind"], row["quantity"]


def draw_rows(draws: dict[int, dict[str, dict]]) -> dict[tuple[str, str, str], dict[int, dict]]:
    """``{row_key: {seed: row}}`` over every draw."""
    out: dict[tuple[str, str, str], dict[int, dict]] = {}
    for seed, records in draws.items():
        for stem, record in records.items():
            for r in record["rows"]:
                out.setdefault(row_key(stem, r), {})[seed] = r
    return out


def draw_claims(draws: dict[int, dict[str, dict]]) -> dict[tuple[str, str], dict[int, dict]]:
    """``{(notebook number, statement): {seed: claim}}``: the claims the notebooks assert (a finding's statement,
    recorded as a claim too, is left to its row)."""
    rows = {k[2] for k in draw_rows(draws)}
    out: dict[tuple[str, str], dict[int, dict]] = {}
    for seed, records in draws.items():
        for stem, record in records.items():
            for c in record["claims"]:
                if c["statement"] not in rows:
                    out.setdefault((stem[:2], c["statement"]), {})[seed] = c
    return out


class Agreement(NamedTuple):
    """What the fresh draws say of one row: ``kind`` (HELD, SAME, EXPLORATORY, MISSING, or OTHER where the row
    is not judged by them) and the table's ``text``."""
    kind: str
    text: str


HELD, SAME, EXPLORATORY, MISSING, OTHER = "held", "same", "exploratory", "missing", "other"


def agreement(own: str | None, fresh: dict[int, str | None], seeds: list[int]) -> Agreement:
    """What the draws say of a verdict: ``own`` is the notebooks' verdict class on their own data (None: an
    illustration), ``fresh`` each draw's (None: the draw has no such row)."""
    missing = [s for s in seeds if fresh.get(s) is None]
    if missing:
        return Agreement(MISSING, f"not in draw {', '.join(map(str, missing))}")
    differ = [s for s in seeds if fresh[s] != own]
    if not differ:
        if own in (REPRODUCED, PARTLY, HOLDS):
            return Agreement(HELD, "held on every fresh draw")
        return Agreement(SAME, f"the same verdict ({own}) on every fresh draw")
    return Agreement(EXPLORATORY, "**exploratory**: " + "; ".join(f"draw {s}: {fresh[s]}" for s in differ))


def summary(page) -> list[str]:
    """The fresh draws in a few lines: what they are, how many verdicts held on every draw, and the claims the
    notebooks assert, draw by draw."""
    out = ["## Fresh draws", ""]
    if not page.seeds:
        return out + ["No fresh draw is on record: `python -m course reproduce --fresh SEED` runs one.", ""]
    judged = [k for k in page.order if k[1] != ILLUSTRATION and k in page.by[page.own]]
    kinds = [page.fresh_cell(k).kind for k in judged]
    held, same, explore = kinds.count(HELD), kinds.count(SAME), kinds.count(EXPLORATORY)
    out += [f"Every row and every asserted claim of notebooks 02-09 was run again on fresh draws "
            f"{', '.join(map(str, page.seeds))} (`python -m course reproduce --fresh SEED`, FAST, the same rules and "
            "thresholds): passages drawn from the seed in the confirmation text, away from the openings and from the "
            "passages the same call reads on the confirmation split (a passage another call reads can still overlap "
            "one: [conventions.md](conventions.md#results-reproductions-illustrations-findings)), needles, passkeys "
            "and notebook 06's models from the seed's own stream. The column *fresh "
            "draws* of every table says whether a verdict held on every draw; a row whose verdict differs on a draw "
            "is **exploratory**: it holds on the data it was chosen on, not beyond it. The draws run FAST, so they "
            "judge the FAST column's verdicts; a full-size verdict is not re-run by them. Every value of every draw: "
            "[fresh-draws.md](fresh-draws.md).", "",
            f"Of {len(judged)} rows with a verdict in the {page.own} column: {held} held on every draw, {same} kept "
            f"the same (negative or inconclusive) verdict, exploratory: {explore}, missing from a draw: "
            f"{kinds.count(MISSING)}.", ""]
    claims = draw_claims(page.draws)
    if claims:
        lost = sum(any(not c["held"] for c in by_seed.values()) or len(by_seed) < len(page.seeds)
                   for by_seed in claims.values())
        out += [f"The claims the notebooks assert (each held on the notebooks' own data, or the notebook would have "
                f"stopped): {len(claims) - lost} of {len(claims)} held on every draw; {lost} failed on a draw or are "
                "missing from one, and are exploratory:", "",
                "| notebook | claim | " + " | ".join(f"draw {s}" for s in page.seeds) + " | fresh draws |",
                "|" + "---|" * (len(page.seeds) + 3)]
        for (nb, statement), by_seed in claims.items():
            cells = [(("held" if by_seed[s]["held"] else "**did not hold**")
                      + ("" if by_seed[s].get("figure") is None else f" ({by_seed[s]['figure']:.3g})"))
                     if s in by_seed else "no such claim" for s in page.seeds]
            verdict = agreement("holds", {s: "holds" if c["held"] else "does not hold" for s, c in by_seed.items()},
                                page.seeds).text
            out.append("| " + " | ".join(cell_text(c) for c in [nb, statement, *cells, verdict]) + " |")
        out.append("")
    return out


def render_draws(page) -> str:
    """The fresh-draws page: every row's value and verdict on the notebooks' own data and on every draw."""
    lines = ["# Fresh draws", "",
             "Every row of notebooks 02-09 on the notebooks' own data (the FAST column of "
             "[reproductions.md](reproductions.md)) and on every fresh draw (`python -m course reproduce --fresh SEED`,"
             " FAST, claims recorded instead of asserted; the rules and thresholds are the notebooks'). What the draws "
             "say of each verdict, and the asserted claims draw by draw: [reproductions.md](reproductions.md#fresh-"
             "draws).", ""]
    for seed in page.seeds:
        runs = "; ".join(f"`{stem}` {r['seconds']} s" for stem, r in page.draws[seed].items())
        first = next(iter(page.draws[seed].values()))
        lines += [f"**draw {seed}** ({first['date']}, commit {first['commit']}, split `{first['split']}`): {runs}.", ""]
    head = ["notebook", "kind", "quantity", f"{page.own}: own data"] + [f"draw {s}" for s in page.seeds]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    drawn = {stem[:2] for records in page.draws.values() for stem in records}
    keys = [k for k in dict.fromkeys([(k[0], k[1], k[3]) for k in page.order] + sorted(page.fresh)) if k[0] in drawn]
    own = {(k[0], k[1], k[3]): r for k, r in page.by[page.own].items()}

    def cell(r: dict | None) -> str:
        if r is None:
            return "*no such row*"
        return value_text(r) + ("" if r["kind"] == ILLUSTRATION else f" — {r['verdict']}")

    for k in keys:
        lines.append("| " + " | ".join(cell_text(c) for c in [k[0], k[1], k[2], cell(own.get(k))]
                                       + [cell(page.fresh.get(k, {}).get(s)) for s in page.seeds]) + " |")
    return "\n".join(lines) + "\n"
