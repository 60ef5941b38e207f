"""The exploration run: ``python -m course explore [NOTEBOOK ...]``.

A threshold is chosen on data the asserting run never reads (``course.splits``). This command executes the
notebooks (FAST) on the exploration split (``COURSE_SPLIT=exploration``) with claims recorded instead of asserted
(``COURSE_CLAIMS=record``), and writes, per notebook, ``docs/exploration/<notebook>.json``: the date, the commit,
every row's measured figure with its interval and n, and every claim's statement, whether it held and its figure.
``docs/thresholds.md`` quotes these figures beside each threshold, and ``tests/test_thresholds.py`` checks the
quotes against the files. The run refuses to write a file for a notebook that drew a confirmation passage or seed.
"""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from course.instructor.reproductions import stored_outputs

__all__ = ["read_provenance", "in_confirmation_text", "confirmation_problems", "split_record", "explore_notebook",
           "check_notebooks", "explore", "figure_text", "entries", "anchor_pattern", "ledger_cell", "EXPLORATION_DIR"]

ROOT = Path(__file__).resolve().parents[2]
EXPLORATION_DIR = ROOT / "docs" / "exploration"
ENV = {"COURSE_SPLIT": "exploration", "COURSE_CLAIMS": "record"}


def read_provenance(executed: Path | str) -> dict | None:
    """What an executed notebook stored with its rows (``course.claims.provenance``): rows, split, draws and
    recorded claims; None when it stored none (an older run, or a notebook without rows)."""
    found = list(stored_outputs(json.loads(Path(executed).read_text(encoding="utf-8"))))
    return found[-1] if found else None


def in_confirmation_text(drawn: dict) -> bool:
    """Whether a text draw (``course.splits.DRAWN``: "source", "start", "end") lies inside its novel's confirmation
    characters (``course.splits.split_range``), whatever its label says."""
    from course.data import load_text
    from course.splits import split_range

    source, _, book = drawn["source"].partition("/")
    end = split_range(len(load_text(source, book)), "confirmation")[1]
    return 0 <= drawn["start"] < drawn["end"] <= end


def confirmation_problems(executed: Path | str) -> list[str]:
    """Why an executed notebook is not an asserted run on confirmation data: it stored no provenance, ran on
    the exploration split, recorded its claims instead of asserting them, or drew a seed or characters outside
    the confirmation split (the ranges are checked against ``course.splits.split_range``, not just the labels)."""
    from course.splits import SEED_BLOCK

    name = Path(executed).name
    stored = read_provenance(executed)
    if stored is None or "drawn" not in stored:
        return [f"{name}: no record of the data it drew (executed before draws were recorded?)"]
    problems = []
    if stored["split"] != "confirmation" or stored["claims_recorded"]:
        problems.append(f"{name}: ran on the {stored['split']} split with claims "
                        f"{'recorded' if stored['claims_recorded'] else 'asserted'}")
    for d in stored["drawn"]:
        if d["what"] == "seed":
            bad = d["split"] != "confirmation" or not 0 <= d["drawn"] < SEED_BLOCK
        else:
            bad = d["split"] != "confirmation" or not in_confirmation_text(d)
        if bad:
            problems.append(f"{name}: drew exploration data: {d}")
    return problems


def _commit() -> str:
    """The commit the notebooks ran at (short hash, "+changes" when the work tree differs from it)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "course", "notebooks")
    return git("rev-parse", "--short=7", "HEAD") + ("+changes" if dirty else "")


def figure_text(entry: dict) -> str:
    """How the ledger quotes an exploration entry: a row's figure with its interval and n, or a claim's
    figure (or whether it held, when the notebook gives no figure)."""
    if entry["type"] == "claim":
        held = "held" if entry["held"] else "did not hold"
        return held if entry.get("figure") is None else f"{entry['figure']:.3g} ({held})"
    if entry.get("low") is None:
        return f"{'yes' if entry['measured'] else 'no'}, n = {entry['n']}"
    if entry["n"] > 1:
        return f"{entry['measured']:.3g} [{entry['low']:.3g} to {entry['high']:.3g}], n = {entry['n']}"
    return f"{entry['measured']:.3g}, n = 1"


def entries(record: dict) -> list[dict]:
    """The entries of a notebook's exploration file: its rows (with their rule), then its claims; each with the
    text a ledger anchor is matched against (``text``)."""
    rows = [{"type": "row", "text": f"{r['quantity']} {r['rule']}", **{k: r[k] for k in
                                                                       ("measured", "low", "high", "n")}}
            for r in record["rows"]]
    claims = [{"type": "claim", "text": c["statement"], "held": c["held"], "figure": c.get("figure")}
              for c in record["claims"]]
    return rows + claims


def anchor_pattern(anchor: str) -> re.Pattern:
    """A ledger anchor as a pattern over printed statements: its longest stretch between double quotes (the
    statement, without the code around it), ``{...}`` fields matching anything."""
    text = max(" ".join(anchor.split()).split('"'), key=len)
    parts = re.split(r"\{[^}]*\}", text)
    return re.compile(".*?".join(re.escape(p) for p in parts))


def ledger_cell(where: str, anchor: str, folder: Path = EXPLORATION_DIR) -> str | None:
    """What ``docs/thresholds.md`` quotes as the exploration figure of the threshold at ``anchor`` in notebook
    ``where``: the figures of every entry of ``folder/<where>.json`` the anchor names, then the run's date and
    commit; None when the notebook has no exploration file or no entry matches (a constant, a code fragment)."""
    path = folder / f"{where}.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    pattern = anchor_pattern(anchor)
    found = [figure_text(e) for e in entries(record) if pattern.search(" ".join(e["text"].split()))]
    if not found:
        return None
    return f"{'; '.join(found)} ({record['date']}, {record['commit']})"


def split_record(path: Path, executed_dir: Path, out_dir: Path, env: dict[str, str], check,
                 timeout: int | None = None) -> dict:
    """Execute ``path`` (FAST, claims recorded) with ``env`` (its ``COURSE_SPLIT``) into ``executed_dir`` and write
    ``out_dir/<stem>.json``: the date, the commit, every row's figure with its interval, n and verdict, and every
    claim's statement, whether it held and its figure. ``check(stored)`` returns the problems that refuse the file
    (data drawn outside the split)."""
    from course.instructor.notebook_times import execute_notebook

    executed = executed_dir / path.name
    seconds = execute_notebook(path, executed, fast=True, timeout=timeout, env=env)
    stored = read_provenance(executed)
    if stored is None:
        raise ValueError(f"{path.name}: the executed notebook stored no rows (does it end with show_reproductions?)")
    problems = check(stored)
    if problems:
        raise ValueError(f"{path.name}: {'; '.join(problems[:3])}")
    record = {"notebook": path.stem, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "commit": _commit(),
              "split": stored["split"], "fast": True, "seconds": round(seconds),
              "rows": [{k: r.get(k) for k in ("kind", "quantity", "rule", "measured", "low", "high", "n", "interval",
                                              "verdict", "model", "scale")} for r in stored["rows"]],
              "claims": [{k: c.get(k) for k in ("statement", "held", "figure")} for c in stored["claims"]],
              "draws": len(stored["drawn"])}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{path.stem}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def _exploration_problems(stored: dict) -> list[str]:
    wrong = [d for d in stored["drawn"] if d["split"] != "exploration"]
    if stored["split"] != "exploration" or wrong:
        return [f"the exploration run drew confirmation data: {wrong[:3]}"]
    return []


def explore_notebook(path: Path, executed_dir: Path, out_dir: Path, timeout: int | None = None) -> dict:
    """Execute ``path`` on the exploration split into ``executed_dir`` and write ``out_dir/<stem>.json``."""
    return split_record(path, executed_dir, out_dir, ENV, _exploration_problems, timeout)


def check_notebooks(notebooks: list[Path], executed_dir: Path) -> None:
    """Refuse an empty list or a missing notebook before anything runs; make the folder for the executed copies."""
    if not notebooks:
        raise ValueError("notebooks must name at least one notebook (e.g. notebooks/02_attention_sinks.ipynb)")
    missing = [str(p) for p in notebooks if not Path(p).is_file()]
    if missing:
        raise ValueError(f"no such notebook: {', '.join(missing)}")
    Path(executed_dir).mkdir(parents=True, exist_ok=True)


def explore(notebooks: list[Path], executed_dir: Path, out_dir: Path = EXPLORATION_DIR,
            timeout: int | None = None) -> list[dict]:
    """``explore_notebook`` for each notebook, one after the other."""
    check_notebooks(notebooks, executed_dir)
    return [explore_notebook(Path(p), Path(executed_dir), Path(out_dir), timeout) for p in notebooks]
