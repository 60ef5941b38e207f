"""No asserted notebook run reads exploration data (course.splits): every executed notebook in $COURSE_EXECUTED
(``scripts/test.sh`` points it at the copies it has just executed; e.g. ``COURSE_EXECUTED=outputs``) stored the
data it drew, and all of it is confirmation data, asserted. Without $COURSE_EXECUTED the checker is tried on
notebooks made here: one that drew only confirmation data passes, and one that drew exploration text, an
exploration seed, or recorded its claims is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from course import syllabus
from course.claims import REPRODUCTION_MIME
from course.instructor.exploration import confirmation_problems

EXECUTED = os.environ.get("COURSE_EXECUTED", "")


def _executed(tmp_path: Path, drawn: list[dict], split: str = "confirmation", recorded: bool = False) -> Path:
    payload = {"notebook": "02", "rows": [], "split": split, "claims_recorded": recorded, "drawn": drawn,
               "claims": []}
    cell = {"cell_type": "code", "source": "show_reproductions('02')", "metadata": {}, "execution_count": 1,
            "outputs": [{"output_type": "display_data", "metadata": {}, "data": {REPRODUCTION_MIME: payload}}]}
    path = tmp_path / "02_attention_sinks.ipynb"
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_the_checker_passes_confirmation_and_refuses_exploration(tmp_path):
    seed = {"split": "confirmation", "what": "seed", "seed": 0, "drawn": 0}
    text = {"split": "confirmation", "what": "text", "source": "austen/emma", "start": 0, "end": 4096}
    assert confirmation_problems(_executed(tmp_path, [seed, text])) == []
    late = dict(text, start=800_000, end=804_096)  # inside Emma's last fifth, though labelled confirmation
    assert "drew exploration data" in confirmation_problems(_executed(tmp_path, [late]))[0]
    explored = {"split": "exploration", "what": "seed", "seed": 0, "drawn": 2**31}
    assert confirmation_problems(_executed(tmp_path, [explored]))
    assert "claims recorded" in confirmation_problems(_executed(tmp_path, [seed], "exploration", True))[0]
    nb = json.loads(_executed(tmp_path, []).read_text())
    nb["cells"][0]["outputs"] = []
    (tmp_path / "02_attention_sinks.ipynb").write_text(json.dumps(nb))
    assert "no record" in confirmation_problems(tmp_path / "02_attention_sinks.ipynb")[0]


@pytest.mark.skipif(not EXECUTED, reason="set COURSE_EXECUTED to a folder of executed notebooks (e.g. outputs)")
def test_no_executed_notebook_read_exploration_data():
    drawing = [nb for nb in syllabus.notebooks() if nb.number != "01"]  # every notebook but 01 draws texts or seeds
    paths = [Path(EXECUTED) / nb.file for nb in drawing]
    missing = [p.name for p in paths if not p.is_file()]
    assert not missing, f"COURSE_EXECUTED={EXECUTED!r} lacks the executed {', '.join(missing)}"
    problems = [p for path in paths for p in confirmation_problems(path)]
    assert not problems, "\n".join(problems)
