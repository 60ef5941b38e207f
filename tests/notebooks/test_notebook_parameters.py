"""Every notebook's parameters cell reads cleanly with papermill's own parser: each assignment is
found as a parameter, and no line is skipped ("Unable to parse line ..." happens when a line holds
more than one "=", e.g. in its comment)."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import nbformat
import pytest
from papermill.translators import PythonTranslator

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")) + sorted((ROOT / "notebooks/student").glob("[0-9]*.ipynb"))


def parameters_cell(path: Path):
    nb = nbformat.read(str(path), as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"{path.name}: expected one cell tagged 'parameters', found {len(cells)}"
    return cells[0]


def test_the_notebooks_are_found():
    solutions = list((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    assert solutions and len(NOTEBOOKS) >= 2 * len(solutions), \
        f"expected the solution and student notebooks under {ROOT / 'notebooks'}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_papermill_parses_every_line_of_the_parameters_cell(path, caplog):
    cell = parameters_cell(path)
    with caplog.at_level(logging.WARNING, logger="papermill"):
        found = [p.name for p in PythonTranslator.inspect(cell)]
    skipped = [r.getMessage() for r in caplog.records if "Unable to parse" in r.getMessage()]
    assert not skipped, f"{path.relative_to(ROOT)}: papermill skips lines of the parameters cell: {skipped}"
    assigned = [t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)]
    assert found == assigned, f"{path.relative_to(ROOT)}: papermill reads parameters {found}, the cell assigns {assigned}"
