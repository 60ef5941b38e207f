"""The reproduction table: ``python -m course reproductions [--from outputs] [--out docs/reproductions.md]``.

Reads the rows each executed notebook stored in its last cell (``course.claims.show_reproductions``, MIME type
``course.claims.REPRODUCTION_MIME``) and writes one markdown page: for every row the paper, table or figure,
the paper's number, the course's, the model and scale that ran and the verdict with its reason and rule;
then the published results of ``course.papers.RESULTS`` that no executed notebook re-ran, so that every
number the course quotes has a line. The site shows the page (``course.instructor.site``).
"""

from __future__ import annotations

import json
from pathlib import Path

from course.claims import REPRODUCTION_MIME, VERDICTS

__all__ = ["read_rows", "render", "write_reproductions"]


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
                    rows += [dict(r, file=path.stem) for r in data["rows"]]
    return rows, runs


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(rows: list[dict], runs: dict[str, str]) -> str:
    """The page: a table of the rows, counts per verdict, and the quoted results not re-run."""
    from course.papers import RESULTS

    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    out = ["# Reproductions", "",
           "Every published result the course quotes or re-runs, the paper's number beside the course's own, and a "
           "verdict computed from the run by a rule written in the notebook before it ran "
           "(`course.claims.Rule`): *reproduced*, *partly*, or *not reproduced at this scale*, with the reason. "
           "Written by `python -m course reproductions` from executed notebooks; the papers are listed in full in "
           "[references.md](references.md).", ""]
    if runs:
        out += ["Notebooks read: " + "; ".join(f"`{n}` ({p or 'default parameters'})" for n, p in runs.items()) + ".",
                ""]
    out += ["Verdicts: " + ", ".join(f"{n} {v}" for v, n in counts.items()) + ".", "",
            "| notebook | paper, table or figure | quantity | paper | course | model, scale | verdict | reason |",
            "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append("| " + " | ".join(_cell(x) for x in (
            r["notebook"], r["source"], r["quantity"], r["paper"], f"{r['measured']:.3g}",
            f"{r['model']}; {r['scale']}", f"**{r['verdict']}**", r["reason"])) + " |")
    out += ["", "## The rules, fixed before the runs", ""]
    seen = set()
    for r in rows:
        if (r["notebook"], r["rule"]) not in seen:
            seen.add((r["notebook"], r["rule"]))
            out.append(f"* `{r['notebook']}`, {_cell(r['source'])}: {_cell(r['rule'])}")
    rerun = {r["result"] for r in rows}
    left = [res for key, res in RESULTS.items() if key not in rerun]
    out += ["", "## Quoted, not re-run by these notebooks", "",
            "These published numbers are quoted (for the setting, or as background) but no executed notebook above "
            "recorded a row for them.", "", "| paper, table or figure | setting | numbers |", "|---|---|---|"]
    for res in left:
        nums = ", ".join(f"{k}: {v:g}" for k, v in res.values.items()) or "(no number)"
        out.append(f"| {_cell(res.source)} | {_cell(res.setting)} | {_cell(nums)} |")
    return "\n".join(out) + "\n"


def write_reproductions(executed: Path | str, out: Path | str) -> dict:
    """Read the rows from ``executed`` and write the page to ``out``. Returns ``{"out", "rows", "verdicts"}``."""
    rows, runs = read_rows(executed)
    if not rows:
        raise ValueError(f"{executed}: no executed notebook holds reproduction rows (execute the notebooks, "
                         "e.g. `bash scripts/run-course.sh --execute --fast`)")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(render(rows, runs), encoding="utf-8")
    return {"out": str(out), "rows": len(rows), "verdicts": {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}}
