"""The reproduction table: ``python -m course reproductions [--from outputs [--from outputs-full]] [--out F]``.

Reads the rows each executed notebook stored in its last cell (``course.claims.show_reproductions``, MIME type
``course.claims.REPRODUCTION_MIME``) from one folder of executed notebooks per column (FAST, full size: the
column is named by the notebooks' papermill parameter ``FAST``), and writes one markdown page with the three
kinds of row apart (``course.claims``): the reproductions, counted in the tally, each with its n, its interval
and its verdict in every column, and where the columns disagree; the illustrations, shown and never counted;
the course's own findings. Then the rules and the published results of ``course.papers.RESULTS`` that no
executed notebook re-ran, so that every number the course quotes has a line.

With fresh draws (``python -m course reproduce --fresh SEED``, read from ``--draws``, default docs/fresh), every
table gains a column saying whether a row's verdict held on every draw (a row whose verdict differs is
*exploratory*), a section sets the asserted claims draw by draw, and ``fresh-draws.md`` beside the page gives every
value of every draw.

A notebook that a column did not run is marked *not run*, with the reason written in that folder's
``not-run.txt`` (lines ``NN_name: reason``); a line for a notebook the column did run explains the rows missing from
it (an older run, before a section was added). The site shows the page (``course.instructor.site``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from course.claims import (DOES_NOT_HOLD, FINDING, HOLDS, ILLUSTRATION, INCONCLUSIVE, REPRODUCTION, REPRODUCTION_MIME,
                           VERDICTS, verdict_class)
from course.instructor.fresh_tables import OTHER, Agreement, agreement, draw_rows, read_draws, render_draws, summary
from course.instructor.fresh_tables import cell_text as _cell
from course.instructor.fresh_tables import value_text as _value

__all__ = ["stored_outputs", "read_rows", "read_not_run", "column_name", "render", "tally", "write_reproductions"]

FINDING_VERDICTS = (HOLDS, INCONCLUSIVE, DOES_NOT_HOLD)

NOT_RUN_FILE = "not-run.txt"

#: what each column's numbers are, said above the table (a column named after its folder gets no line)
COLUMN_MEANING = {
    "FAST": "the quick mode every test run executes (`FAST = True`): fewer and shorter passages, seeds and prompts, "
            "minutes per notebook on two cores",
    "full size": "the sizes the notebooks are written for (`FAST = False`): more passages, longer prompts, 2 to 25 "
                 "minutes per notebook on two cores",
}


def stored_outputs(nb: dict) -> Iterator[dict]:
    """What ``course.claims.show_reproductions`` stored in an executed notebook ``nb`` (its JSON), in cell order:
    rows, split, draws and recorded claims, one per output."""
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            data = out.get("data", {}).get(REPRODUCTION_MIME)
            if data:
                yield data


def read_rows(executed: Path | str) -> tuple[list[dict], dict[str, str]]:
    """Every row stored in the executed notebooks ``NN_*.ipynb`` of ``executed``, and how each notebook ran
    (``{notebook: "FAST = True, MODEL = ..."}``, from papermill's record)."""
    executed = Path(executed)
    if not executed.is_dir():
        raise ValueError(f"--from {str(executed)!r} is not a folder of executed notebooks")
    rows, runs = [], {}
    for path in sorted(executed.glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        params = (nb.get("metadata", {}).get("papermill") or {}).get("parameters") or {}
        runs[path.stem] = ", ".join(f"{k} = {v!r}" for k, v in params.items() if k in ("MODEL", "FAST", "SEED"))
        for data in stored_outputs(nb):
            rows += [dict({"kind": REPRODUCTION, "n": 1, "low": None, "high": None,
                           "interval": "one value"}, **r, file=path.stem) for r in data["rows"]]
    return rows, runs


def read_not_run(executed: Path | str) -> dict[str, str]:
    """``{notebook stem: why it was not run}`` from the folder's ``not-run.txt`` (none: {})."""
    path = Path(executed) / NOT_RUN_FILE
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, why = line.partition(":")
            out[name.strip()] = why.strip()
    return out


def column_name(executed: Path | str, runs: dict[str, str]) -> str:
    """A column's name: "FAST" or "full size" from the notebooks' FAST parameter, else the folder's name."""
    fast = {"FAST = True" in p for p in runs.values()} if all("FAST = " in p for p in runs.values()) else set()
    return {frozenset({True}): "FAST", frozenset({False}): "full size"}.get(frozenset(fast), Path(executed).name)


def _key(r: dict) -> tuple:
    return (r["notebook"], r["kind"], r.get("result"), r["quantity"])


_SAME = ("measured", "low", "high", "n", "scale", "model")
SAME_RUNS = "*the same runs as {first}*"  # a later column's row whose every number is the first column's


def _same_runs(r: dict, other: dict | None) -> bool:
    """Whether a row repeats ``other`` (the first column's): the same numbers from the same scale and model are
    the same runs, counted once (notebook 06's trained models are the fast preset in both columns)."""
    return other is not None and all(r.get(k) == other.get(k) for k in _SAME)


Columns = dict[str, tuple[list[dict], dict[str, str], dict[str, str]]]


class _Page:
    """What every part of the page reads: the columns, every row once in the order the notebooks recorded them
    (``order``, ``first``), each column's rows by key (``by``), and which of them repeat the first column's."""

    def __init__(self, columns: Columns, draws: dict[int, dict[str, dict]] | None = None):
        self.draws = draws or {}
        self.seeds = sorted(self.draws)
        self.fresh = draw_rows(self.draws)
        self.columns, self.names = columns, list(columns)
        self.order, self.first = [], {}
        for name in self.names:
            for r in columns[name][0]:
                if _key(r) not in self.first:
                    self.order.append(_key(r))
                    self.first[_key(r)] = r
        self.by = {name: {_key(r): r for r in columns[name][0]} for name in self.names}
        head = self.by[self.names[0]]
        self.repeated = {name: {k for k, r in self.by[name].items() if _same_runs(r, head.get(k))}
                         for name in self.names[1:]}

    def counted(self, name: str) -> list[dict]:
        """A column's rows that are its own runs (not repeats of the first column's)."""
        return [r for r in self.columns[name][0] if _key(r) not in self.repeated.get(name, ())]

    def absent(self, name: str, key: tuple) -> str:
        _, runs, not_run = self.columns[name]
        why = next((w for stem, w in not_run.items() if stem[:2] == key[0]), "")
        if any(stem[:2] == key[0] for stem in runs):  # the notebook ran, without this row (``why``: e.g. an older run)
            return "*no such row in this run*" + (f": {why}" if why else "")
        return "*not run*" + (f": {why}" if why else "")

    def cells(self, k: tuple, verdict: bool = True) -> list[str]:
        """A row's cells in every column: the value, scale and model (and the verdict)."""
        cells = []
        for name in self.names:
            r = self.by[name].get(k)
            if r is None:
                cells += [self.absent(name, k)] + ([""] if verdict else [])
            elif k in self.repeated.get(name, ()):
                cells += [SAME_RUNS.format(first=self.names[0])] + ([""] if verdict else [])
            else:
                cells += [f"{_value(r)}; {r['model']}, {r['scale']}"] + (
                    [f"**{r['verdict']}** — {r['reason']}"] if verdict else [])
        return cells

    @property
    def own(self) -> str:
        """The column the fresh draws are set beside: FAST (the draws run FAST), else the first."""
        return "FAST" if "FAST" in self.by else self.names[0]

    def fresh_cell(self, k: tuple) -> Agreement:
        """What the fresh draws say of row ``k``: whether its verdict held on every draw (an illustration: its
        value on each draw)."""
        found = self.fresh.get((k[0], k[1], k[3]), {})
        if not any(stem[:2] == k[0] for records in self.draws.values() for stem in records):
            return Agreement(OTHER, "notebook not drawn")
        if k[1] == ILLUSTRATION:
            return Agreement(OTHER, "; ".join(f"draw {s}: " + (_value(found[s]) if s in found else "no such row")
                                              for s in self.seeds))
        mine = self.by[self.own].get(k)
        if mine is None:
            return Agreement(OTHER, f"no {self.own} row to compare")
        return agreement(verdict_class(mine["verdict"]), {s: verdict_class(r["verdict"]) for s, r in found.items()},
                         self.seeds)

    def fresh_head(self) -> list[str]:
        return [f"fresh draws {', '.join(map(str, self.seeds))}"] if self.seeds else []

    def table(self, kind: str, head: list[str], cells) -> list[str]:
        keys = [k for k in self.order if k[1] == kind]
        if not keys:
            return ["(none)", ""]
        head = head + self.fresh_head()
        return (["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                + ["| " + " | ".join(_cell(c) for c in cells(k) + ([self.fresh_cell(k).text] if self.seeds else []))
                   + " |" for k in keys] + [""])


INTRO = [
    "# Reproductions", "",
    "Every published result the course quotes or re-runs, the paper's number beside the course's own, in three "
    "kinds kept apart (`course.claims`):", "",
    "* **reproductions** — the paper's own quantity re-measured in the paper's setting (the row states the setting), "
    "scaled down and said so; each gets a verdict from a rule whose history [thresholds.md](thresholds.md) gives "
    "commit by commit (its value, why, the commit it was fixed in, and its figure on the exploration split, which "
    "the verdict never reads: most rules were first set on runs that were also the asserted runs, and checked on the "
    "exploration split only afterwards; the [fresh draws](#fresh-draws) re-run them on data drawn after the rules, "
    "which no one had read): *reproduced* or *partly* only when the whole interval clears the "
    "threshold (for a median, the order-statistic interval whose exact coverage is at least 95 %: the range of 6 to "
    "8 values, the 2nd smallest to the 2nd largest of 9 to 11, the 3rd from 12; `course.stats`), *inconclusive at "
    "n = ...* when it straddles one or when it rests on 2 to 4 values (their range covers the median only "
    "1 - 2^(1-n) of the time: 75 % at n = 3, 88 % at n = 4), else *not reproduced at this scale*;",
    "* **illustrations** — true by construction, a different quantity than the paper's, or the paper's quantity in "
    "another setting: shown beside the paper's number, never given a verdict;",
    "* **the course's own findings** — statements no paper measured: *holds*, *does not hold* or "
    "*inconclusive at n = ...*.", "",
    "The tally counts the three kinds apart. A later column's row with exactly the first column's numbers comes from "
    "the same runs and is counted once. Every row gives its n (passages, seeds, prompts or timing repetitions) and, "
    "from two values on, the interval its verdict was judged on. Written by `python -m course reproductions --from "
    "outputs --from outputs-full` from executed notebooks, one column per folder; the papers are listed in full in "
    "[references.md](references.md).", ""]


def _columns_read(page: _Page) -> list[str]:
    out = []
    for name in page.names:
        rows, runs, not_run = page.columns[name]
        read = "; ".join(f"`{n}` ({p or 'default parameters'})" for n, p in runs.items())
        skipped = "; ".join(f"`{n}` not run: {w}" if n not in runs else f"`{n}`: {w}" for n, w in not_run.items())
        meaning = f" ({COLUMN_MEANING[name]})" if name in COLUMN_MEANING else ""
        out += [f"**{name}**{meaning}: notebooks read: {read or 'none'}." + (f" {skipped}." if skipped else ""), ""]
    return out


def tally(rows: list[dict]) -> dict[str, dict[str, int]]:
    """``{kind: {verdict: count}}`` of a column's own rows: the reproductions by ``VERDICTS``, the findings by
    holds / does not hold / inconclusive, the illustrations as one count."""
    out = {}
    for kind, verdicts in ((REPRODUCTION, VERDICTS), (FINDING, FINDING_VERDICTS), (ILLUSTRATION, ("shown",))):
        mine = [r for r in rows if r["kind"] == kind]
        out[kind] = ({"shown": len(mine)} if kind == ILLUSTRATION else
                     {v: sum(verdict_class(r["verdict"]) == v for r in mine) for v in verdicts})
    return out


def _tallies(page: _Page) -> list[str]:
    parts = []
    for name in page.names:
        t = tally(page.counted(name))
        parts.append(f"{name}: {sum(t[REPRODUCTION].values())} reproductions — "
                     + ", ".join(f"{n} {v}" for v, n in t[REPRODUCTION].items())
                     + f"; {t[ILLUSTRATION]['shown']} illustrations; {sum(t[FINDING].values())} findings — "
                     + ", ".join(f"{n} {v}" for v, n in t[FINDING].items()))
    return ["Tally (each kind apart): " + "; ".join(parts) + ".", ""]


def _disagreements(page: _Page) -> list[str]:
    a, b = page.names[:2]
    diff = []
    for k in page.order:
        if k[1] == REPRODUCTION and k in page.by[a] and k in page.by[b] and k not in page.repeated[b]:
            va, vb = (page.by[n][k]["verdict"] for n in (a, b))
            if verdict_class(va) != verdict_class(vb):
                diff.append(f"* `{k[0]}`, {_cell(page.first[k]['source'])}, {_cell(k[3])}: {a} *{va}*, {b} *{vb}*.")
    return [f"### Where {a} and {b} disagree", ""] + (diff or ["The verdicts agree wherever both columns have the "
                                                                "row."]) + [""]


def _rules_and_quoted(page: _Page) -> list[str]:
    from course.papers import RESULTS

    out = ["## The rules", "",
           "Each rule's value, why that size, the commit it was fixed in, the runs it was set on, its figure on the "
           "exploration split and every change since: [thresholds.md](thresholds.md).", ""]
    seen = set()
    for k in page.order:
        r = page.first[k]
        if r["rule"] and (r["notebook"], r["rule"]) not in seen:
            seen.add((r["notebook"], r["rule"]))
            out.append(f"* `{r['notebook']}`, {_cell(r['source'])}: {_cell(r['rule'])}")
    rerun = {k[2] for k in page.order}
    out += ["", "## Quoted, not re-run by these notebooks", "",
            "These published numbers are quoted (for the setting, or as background) but no executed notebook above "
            "recorded a row for them.", "", "| paper, table or figure | setting | numbers |", "|---|---|---|"]
    for res in (res for key, res in RESULTS.items() if key not in rerun):
        nums = ", ".join(f"{k}: {v:g}" for k, v in res.values.items()) or "(no number)"
        out.append(f"| {_cell(res.source)} | {_cell(res.setting)} | {_cell(nums)} |")
    return out


def render(columns: Columns, draws: dict[int, dict[str, dict]] | None = None) -> str:
    """The page from ``{column name: (rows, runs, not_run)}`` (``read_rows`` and ``read_not_run`` of each folder)
    and the fresh draws (``course.instructor.fresh_draws.read_draws``), if any."""
    page = _Page(columns, draws)
    names, first = page.names, page.first
    out = INTRO + _columns_read(page) + _tallies(page) + summary(page) + ["## Reproductions (counted)", ""]
    out += page.table(REPRODUCTION, ["notebook", "paper, table or figure", "quantity and setting", "paper"]
                      + [h for name in names for h in (f"{name}: course", f"{name}: verdict")],
                      lambda k: [k[0], first[k]["source"], first[k]["quantity"], first[k]["paper"]] + page.cells(k))
    if len(names) > 1:
        out += _disagreements(page)
    out += ["## Illustrations (shown, not counted)", ""]
    out += page.table(ILLUSTRATION, ["notebook", "paper, table or figure", "quantity shown here", "paper"]
                      + [f"{name}: course" for name in names] + ["why it is not a reproduction"],
                      lambda k: [k[0], first[k]["source"], first[k]["quantity"], first[k]["paper"]]
                      + page.cells(k, False) + [first[k]["reason"]])
    out += ["## The course's own findings (no paper)", ""]
    out += page.table(FINDING, ["notebook", "statement"] + [h for name in names for h in (f"{name}: measured",
                                                                                           f"{name}: verdict")],
                      lambda k: [k[0], k[3]] + page.cells(k))
    return "\n".join(out + _rules_and_quoted(page)) + "\n"


def write_reproductions(executed, out: Path | str, draws_dir: Path | str | None = None) -> dict:
    """Read the rows from ``executed`` (one folder, or a list of folders: one column each) and the fresh draws under
    ``draws_dir`` (``course.instructor.fresh_draws``; None: none), and write the page to ``out`` (and, with draws,
    ``fresh-draws.md`` beside it). Returns ``{"out", "rows", "columns": {name: {verdict: count}}}``."""
    folders = [executed] if isinstance(executed, (str, Path)) else list(executed)
    columns = {}
    for folder in folders:
        rows, runs = read_rows(folder)
        if not rows:
            raise ValueError(f"{folder}: no executed notebook holds reproduction rows (execute the notebooks, "
                             "e.g. `bash scripts/run-course.sh --execute --fast`)")
        name = column_name(folder, runs)
        if name in columns:
            raise ValueError(f"two folders give the column {name!r}: give one FAST and one full-size folder")
        columns[name] = (rows, runs, read_not_run(folder))
    draws = read_draws(draws_dir) if draws_dir is not None else {}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(render(columns, draws), encoding="utf-8")
    page = _Page(columns, draws)
    if draws:
        (Path(out).parent / "fresh-draws.md").write_text(render_draws(page), encoding="utf-8")
    counts = {name: tally(page.counted(name))[REPRODUCTION] for name in columns}
    return {"out": str(out), "rows": sum(len(c[0]) for c in columns.values()), "columns": counts,
            "kinds": {name: tally(page.counted(name)) for name in columns}}
