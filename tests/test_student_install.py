"""What a student installs holds nothing graded: the package built as a wheel and installed alone into a fresh venv
contains no exercise's solution, no question's answer or hint, and no held-out passage of the capstone. Those are
in the solution notebooks, the answer key beside them and the grading key that release writes, all the
instructor's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course.instructor.solutions import exercise_cells, without_markers
from tests.solutions import answer_key

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
# Exercises whose solution *is* one of the course's public mechanisms, on purpose: notebook 06 asks for the two
# functions its training uses (``course.train.prepend_sink``, ``lm_loss``) and notebook 01 for the bytes formula of
# ``course.memory``. Their checkers refuse a call to them (a shortcut); copying their source is plagiarism.
PUBLIC_MECHANISMS = {"06.prepend_sink", "06.lm_loss", "01.kv_bytes_per_token"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The ``course`` folder of a fresh venv where only the package's wheel was installed (no dependencies)."""
    work = tmp_path_factory.mktemp("student-install")
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "course", src / "course", ignore=shutil.ignore_patterns("__pycache__"))
    run = dict(check=True, capture_output=True, text=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(work / "wheels"), str(src)], **run)
    subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], **run)
    [wheel] = (work / "wheels").glob("*.whl")
    subprocess.run([str(work / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   **run)
    [package] = (work / "venv").glob("lib/python*/site-packages/course")
    return package


def _normalised(text: str) -> str:
    return re.sub(r"\s+", "", text)


@pytest.fixture(scope="module")
def installed_text(installed) -> str:
    files = sorted(p for p in installed.rglob("*") if p.is_file() and p.suffix != ".pyc")
    assert any(p.name == "core.py" for p in files), [p.name for p in files]
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)


def _solution_bodies() -> dict[str, str]:
    """{exercise id: its solution region's code (markers and comments dropped)} of every solution notebook."""
    out = {}
    for path in sorted(NOTEBOOKS.glob("[0-9]*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for ex_id, cell in exercise_cells(nb).items():
            source = nb.cells[cell.solution].source
            region = source[source.index("BEGIN SOLUTION"):source.index("END SOLUTION")].split("\n", 1)[1]
            lines = [line.split("#")[0].rstrip() for line in without_markers(region).splitlines()]
            out[ex_id] = "\n".join(line for line in lines if line.strip())
    return out


@pytest.mark.slow
def test_no_notebook_and_no_answer_key_is_installed(installed):
    names = {p.name for p in installed.rglob("*")}
    assert "answer_key.py" not in names and not any(n.endswith(".ipynb") for n in names)


@pytest.mark.parametrize("exercise_id, body", sorted(_solution_bodies().items()))
def test_no_solution_is_in_the_package(installed_text, exercise_id, body):
    if exercise_id in PUBLIC_MECHANISMS or ".q_" in exercise_id:
        pytest.skip("a public mechanism on purpose (see PUBLIC_MECHANISMS)" if ".q_" not in exercise_id else
                    "a question: its answer is tested below")
    package = _normalised(installed_text)
    assert _normalised(body) not in package, f"{exercise_id}'s solution is in the package"
    lines = [line.strip() for line in body.splitlines() if len(line.strip()) >= 30]
    found = [line for line in lines if _normalised(line) in package]
    assert len(found) < max(2, len(lines) / 2), f"{exercise_id}: solution lines in the package: {found}"


def test_no_answer_or_hint_is_in_the_package(installed_text):
    keys = answer_key().values()
    texts = [text for key in keys for text in (key.nudge, *key.hints.values()) if len(text) >= 25]
    assert len(texts) > 50
    leaked = [text for text in texts if text in installed_text]
    assert not leaked, leaked[:3]


def test_no_held_out_passage_is_in_the_package(installed_text, grading_key):
    passages = json.loads(grading_key.read_text())["passages"]
    assert len(passages) >= 8
    offsets = {str(offset) for _, offset in passages} | {f"{offset:_}" for _, offset in passages}
    leaked = [o for o in offsets if re.search(rf"\b{o}\b", installed_text)]
    assert not leaked and "HELD_OUT" not in installed_text, leaked
