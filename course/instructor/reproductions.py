"""The reproduction table: ``python -m course reproductions [--from outputs [--from outputs-full]] [--out F]``.

Reads the rows each executed notebook stored in its last cell (``course.claims.show_reproductions``, MIME type
``course.claims.REPRODUCTION_MIME``) from one folder of executed notebooks per column (FAST, full size: the
column is named by the notebooks' papermill parameter ``FAST``), and writes one markdown page with the three
kinds of row apart (``course.claims``): the reproductions, counted in the tally, each with its n, its interval
and its verdict in every column, and where the columns disagree; the illustrations, shown and never counted;
the course's own findings. Then the rules and the published results of ``course.papers.RESULTS`` that no
executed notebook re-ran, so that every number the course quotes has a line.

A notebook that a column did not run is marked *not run*, with the reason written in that folder's
``not-run.txt`` (lines ``NN_name: reason``); a line for a notebook the column did run explains the rows missing from
it (an older run, before a section was added). The site shows the page (``course.instructor.site``).
"""

from __future__ import annotations

import json
from pathlib import Path

from course.claims import FINDING, ILLUSTRATION, REPRODUCTION, REPRODUCTION_MIME, VERDICTS, verdict_class

__all__ = ["read_rows", "read_not_run", "column_name", "render", "write_reproductions"]

NOT_RUN_FILE = "not-run.txt"

#: what each column's numbers are, said above the table (a column named after its folder gets no line)
COLUMN_MEANING = {
    "FAST": "the quick mode every test run executes (`FAST = True`): fewer and shorter passages, seeds and prompts, "
            "minutes per notebook on two cores",
    "full size": "the sizes the notebooks are written for (`FAST = False`): more passages, longer prompts, 2 to 25 "
                 "minutes per notebook on two cores",
}


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
        for cell in nb.get("cells", []):
            for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
                data = out.get("data", {}).get(REPRODUCTION_MIME)
                if data:
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


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _value(r: dict) -> str:
    """A row's number with its n and interval: ``1.22 [1.1 to 1.4, range], n = 6``."""
    if r.get("low") is None and r["kind"] == FINDING:  # a yes/no finding (course.claims.report)
        return f"{'yes' if r['measured'] else 'no'}, n = {r['n']}"
    if r["n"] > 1 and r.get("low") is not None:
        return f"{r['measured']:.3g} [{r['low']:.3g} to {r['high']:.3g}, {r['interval']}], n = {r['n']}"
    return f"{r['measured']:.3g}, n = {r['n']}"


def _key(r: dict) -> tuple:
    return (r["notebook"], r["kind"], r.get("result"), r["quantity"])


def render(columns: dict[str, tuple[list[dict], dict[str, str], dict[str, str]]]) -> str:
    """The page from ``{column name: (rows, runs, not_run)}`` (``read_rows`` and ``read_not_run`` of each folder)."""
    from course.papers import RESULTS

    names = list(columns)
    order, first = [], {}
    for name in names:  # every row once, in the order the notebooks recorded them
        for r in columns[name][0]:
            if _key(r) not in first:
                order.append(_key(r))
                first[_key(r)] = r
    by = {name: {_key(r): r for r in columns[name][0]} for name in names}

    def absent(name: str, key: tuple) -> str:
        _, runs, not_run = columns[name]
        why = next((w for stem, w in not_run.items() if stem[:2] == key[0]), "")
        if any(stem[:2] == key[0] for stem in runs):  # the notebook ran, without this row (``why``: e.g. an older run)
            return "*no such row in this run*" + (f": {why}" if why else "")
        return "*not run*" + (f": {why}" if why else "")

    out = ["# Reproductions", "",
           "Every published result the course quotes or re-runs, the paper's number beside the course's own, in three "
           "kinds kept apart (`course.claims`):", "",
           "* **reproductions** — a paper's quantity re-measured in its own setting, scaled down and said so; each "
           "gets a verdict from a rule fixed before the run (its value, why and the commit it was fixed in: "
           "[thresholds.md](thresholds.md)): *reproduced* or *partly* only when the whole interval clears the "
           "threshold (a bootstrap 95 % interval from 8 values on, the full range of fewer), *inconclusive at n = "
           "...* when it straddles one, else *not reproduced at this scale*. Only these are counted;",
           "* **illustrations** — true by construction, or a different quantity than the paper's: shown beside the "
           "paper's number, never given a verdict, never counted;",
           "* **the course's own findings** — statements no paper measured: *holds*, *does not hold* or "
           "*inconclusive at n = ...*.", "",
           "Every row gives its n (passages, seeds, prompts or timing repetitions) and, from two values on, the "
           "interval its verdict was judged on. Written by `python -m course reproductions --from outputs --from "
           "outputs-full` from executed notebooks, one column per folder; the papers are listed in full in "
           "[references.md](references.md).", ""]
    for name in names:
        rows, runs, not_run = columns[name]
        read = "; ".join(f"`{n}` ({p or 'default parameters'})" for n, p in runs.items())
        skipped = "; ".join(f"`{n}` not run: {w}" if n not in runs else f"`{n}`: {w}" for n, w in not_run.items())
        meaning = f" ({COLUMN_MEANING[name]})" if name in COLUMN_MEANING else ""
        out += [f"**{name}**{meaning}: notebooks read: {read or 'none'}." + (f" {skipped}." if skipped else ""), ""]
    tallies = []
    for name in names:
        reps = [r for r in columns[name][0] if r["kind"] == REPRODUCTION]
        counts = {v: sum(verdict_class(r["verdict"]) == v for r in reps) for v in VERDICTS}
        tallies.append(f"{name}: {len(reps)} reproductions — " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    out += ["Tally (reproductions only): " + "; ".join(tallies) + ".", ""]

    def table(kind: str, head: list[str], cells) -> None:
        keys = [k for k in order if k[1] == kind]
        if not keys:
            out.extend(["(none)", ""])
            return
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for k in keys:
            out.append("| " + " | ".join(_cell(c) for c in cells(k)) + " |")
        out.append("")

    def per_column(k: tuple, verdict: bool = True) -> list[str]:
        cells = []
        for name in names:
            r = by[name].get(k)
            if r is None:
                cells += [absent(name, k)] + ([""] if verdict else [])
            else:
                cells += [f"{_value(r)}; {r['model']}, {r['scale']}"] + (
                    [f"**{r['verdict']}** — {r['reason']}"] if verdict else [])
        return cells

    out += ["## Reproductions (counted)", ""]
    table(REPRODUCTION, ["notebook", "paper, table or figure", "quantity", "paper"]
          + [h for name in names for h in (f"{name}: course", f"{name}: verdict")],
          lambda k: [k[0], first[k]["source"], first[k]["quantity"], first[k]["paper"]] + per_column(k))
    if len(names) > 1:
        out += [f"### Where {names[0]} and {names[1]} disagree", ""]
        diff = []
        for k in order:
            if k[1] == REPRODUCTION and k in by[names[0]] and k in by[names[1]]:
                a, b = (verdict_class(by[n][k]["verdict"]) for n in names[:2])
                if a != b:
                    diff.append(f"* `{k[0]}`, {_cell(first[k]['source'])}, {_cell(k[3])}: {names[0]} "
                                f"*{by[names[0]][k]['verdict']}*, {names[1]} *{by[names[1]][k]['verdict']}*.")
        out += (diff or ["The verdicts agree wherever both columns have the row."]) + [""]
    out += ["## Illustrations (shown, not counted)", ""]
    table(ILLUSTRATION, ["notebook", "paper, table or figure", "quantity shown here", "paper"]
          + [f"{name}: course" for name in names] + ["why it is not a reproduction"],
          lambda k: [k[0], first[k]["source"], first[k]["quantity"], first[k]["paper"]] + per_column(k, False)
          + [first[k]["reason"]])
    out += ["## The course's own findings (no paper)", ""]
    table(FINDING, ["notebook", "statement"] + [h for name in names for h in (f"{name}: measured",
                                                                                 f"{name}: verdict")],
          lambda k: [k[0], k[3]] + per_column(k))
    out += ["## The rules, fixed before the runs", "",
            "Each rule's value, why that size, the commit it was fixed in and every change since: "
            "[thresholds.md](thresholds.md).", ""]
    seen = set()
    for k in order:
        r = first[k]
        if r["rule"] and (r["notebook"], r["rule"]) not in seen:
            seen.add((r["notebook"], r["rule"]))
            out.append(f"* `{r['notebook']}`, {_cell(r['source'])}: {_cell(r['rule'])}")
    rerun = {k[2] for k in order}
    left = [res for key, res in RESULTS.items() if key not in rerun]
    out += ["", "## Quoted, not re-run by these notebooks", "",
            "These published numbers are quoted (for the setting, or as background) but no executed notebook above "
            "recorded a row for them.", "", "| paper, table or figure | setting | numbers |", "|---|---|---|"]
    for res in left:
        nums = ", ".join(f"{k}: {v:g}" for k, v in res.values.items()) or "(no number)"
        out.append(f"| {_cell(res.source)} | {_cell(res.setting)} | {_cell(nums)} |")
    return "\n".join(out) + "\n"


def write_reproductions(executed, out: Path | str) -> dict:
    """Read the rows from ``executed`` (one folder, or a list of folders: one column each) and write the page to
    ``out``. Returns ``{"out", "rows", "columns": {name: {verdict: count}}}``."""
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
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(render(columns), encoding="utf-8")
    counts = {name: {v: sum(r["kind"] == REPRODUCTION and verdict_class(r["verdict"]) == v for r in rows)
                     for v in VERDICTS} for name, (rows, _, _) in columns.items()}
    return {"out": str(out), "rows": sum(len(c[0]) for c in columns.values()), "columns": counts}
