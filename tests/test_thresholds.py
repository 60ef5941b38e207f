"""The threshold ledger (docs/thresholds.md) and the code agree: every fragment it quotes is in its file with the
value it gives, every claim, rule and finding of the notebooks has a row, course.train.THRESHOLDS equals its rows,
a notebook that names the commit a threshold was fixed in names one the ledger gives, and every row quotes the
figure its notebook's exploration run measured (docs/exploration/*.json, ``python -m course explore``), with that
run's date and commit."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from course.papers import numbers_in

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "docs" / "thresholds.md"
NOTEBOOKS = {p.stem: p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
CALLS = ("claim", "Rule", "finding", "report", "table3_rule")


def _flat(text: str) -> str:
    return " ".join(text.split())



def _unquote(cell: str) -> str:
    """A table cell without the backticks around it."""
    return cell[1:-1] if cell.startswith("`") and cell.endswith("`") else cell

def ledger_rows() -> list[dict]:
    """The rows of the table "Thresholds in force": id, where, anchor, code, value, why, fixed."""
    rows = []
    for line in LEDGER.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| ") or line.startswith("| id |"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 8:
            continue
        rows.append({"id": cells[0], "where": cells[1], "anchor": _unquote(cells[2]), "code": _unquote(cells[3]),
                     "value": cells[4], "exploration": cells[5], "why": cells[6], "fixed": cells[7]})
    return rows


def code_cells(stem: str) -> list[str]:
    nb = json.loads(NOTEBOOKS[stem].read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def source_of(where: str) -> str:
    return "\n".join(code_cells(where)) if where in NOTEBOOKS else (ROOT / where).read_text(encoding="utf-8")


ROWS = ledger_rows()


def test_the_ledger_has_a_row_for_every_kind_of_threshold():
    assert len(ROWS) >= 50 and len({r["id"] for r in ROWS}) == len(ROWS), "ids must be unique"
    for r in ROWS:
        assert r["why"] and re.search(r"\b[0-9a-f]{7}\b|this change", r["fixed"]), r["id"]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["id"])
def test_every_fragment_is_in_its_file_with_its_value(row):
    text = _flat(source_of(row["where"]))
    assert _flat(row["anchor"]) in text, f"{row['id']}: anchor {row['anchor']!r} is not in {row['where']}"
    assert _flat(row["code"]) in text, (f"{row['id']}: {row['code']!r} is not in {row['where']}: a threshold changed "
                                        "without docs/thresholds.md (or the ledger quotes it wrongly)")
    assert numbers_in(row["value"]) <= numbers_in(row["code"]) | numbers_in(row["anchor"]), row["id"]


@pytest.mark.parametrize("stem", list(NOTEBOOKS))
def test_every_claim_and_rule_of_a_notebook_has_a_row(stem):
    anchors = [_flat(r["anchor"]) for r in ROWS if r["where"] == stem]
    missing = []
    for src in code_cells(stem):
        cell = _flat(src)
        tree = ast.parse("\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!"))))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CALLS:
                call = _flat(ast.get_source_segment(src, node) or "")
                # a call carries its own threshold, or (claim(held, ...)) its cell holds the ledger's fragment
                if not any(a in call for a in anchors) and not any(a in cell for a in anchors):
                    missing.append(call[:120])
    assert not missing, f"{stem}: claims or rules with no row in docs/thresholds.md:\n  " + "\n  ".join(missing)


def test_the_shared_thresholds_equal_their_rows():
    from course.stats import MIN_FOR_CLAIM, MIN_FOR_INTERVAL
    from course.train import THRESHOLDS

    by_id = {r["id"]: r for r in ROWS}
    for name, value in THRESHOLDS.items():
        assert numbers_in(by_id[f"06-{name}"]["value"]) == {float(value)}, name
    assert numbers_in(by_id["interval"]["value"]) == {float(MIN_FOR_INTERVAL)}
    assert numbers_in(by_id["claim-values"]["value"]) == {float(MIN_FOR_CLAIM)}


def test_a_commit_a_notebook_names_beside_a_threshold_is_the_ledgers():
    fixed = {}
    for r in ROWS:
        fixed.setdefault(r["where"], set()).update(re.findall(r"\b[0-9a-f]{7}\b", r["fixed"]))
    history = LEDGER.read_text(encoding="utf-8").split("## History", 1)[1]
    for stem, path in NOTEBOOKS.items():
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            text = "".join(cell["source"])
            for sentence in re.split(r"(?<=[.;])\s", text):
                if not re.search(r"\b(?:fixed|moved|changed|dropped|bound)\b", sentence):
                    continue
                for commit in re.findall(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7}\b", sentence):
                    known = fixed.get(stem, set()) | fixed.get("course/train.py", set())
                    assert commit in known or commit in history, f"{stem}: {commit} is not in the ledger"
            assert "fixed at 10 % before the run" not in text, f"{stem}: contradicted by the history (4310adb)"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["id"])
def test_every_row_quotes_its_exploration_figure(row):
    """The exploration cell is what ``ledger_cell`` computes from the notebook's exploration file: the figures of
    the rows and claims the anchor names, with the run's date and commit; a row no exploration entry can name (a
    constant, a fragment of code) says so and points to the rows that carry its figures."""
    from course.instructor.exploration import ledger_cell

    by_id = {r["id"]: r for r in ROWS}
    cell = row["exploration"]
    want = ledger_cell(row["where"], row["anchor"])
    if want is not None:
        assert cell == want, f"{row['id']}: the ledger says {cell!r}, docs/exploration says {want!r}"
        return
    assert cell.startswith(("constant", "no figure")), f"{row['id']}: no exploration entry matches, and {cell!r}"
    for other in re.findall(r"\b0\d-[a-z][a-z0-9-]*\b", cell):
        assert other in by_id and ledger_cell(by_id[other]["where"], by_id[other]["anchor"]), (row["id"], other)
