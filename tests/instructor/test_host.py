"""Where the course lives: one setting in pyproject.toml, the Colab cells and README links follow it."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest

from course.instructor import host
from course.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_repository_is_in_sync_with_its_setting():
    assert host.check(ROOT) == []


@pytest.fixture
def copy(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copy(ROOT / "README.md", tmp_path)
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks", ignore=shutil.ignore_patterns("student"))
    return tmp_path


def test_setting_the_home_rewrites_every_cell_and_the_links(copy, capsys):
    assert main(["host", "--root", str(copy), "--repo", "https://github.com/someone/sinks", "--branch", "v2"]) == 0
    assert host.read_host(copy) == host.Host("https://github.com/someone/sinks", "v2")
    assert host.check(copy) == []
    for path in sorted((copy / "notebooks").glob("[0-9]*.ipynb")):
        cell = next(c for c in json.loads(path.read_text())["cells"] if "colab" in c["metadata"].get("tags", []))
        assert 'REPO, BRANCH = "https://github.com/someone/sinks", "v2"' in "".join(cell["source"])
    readme = (copy / "README.md").read_text()
    assert "https://mybinder.org/v2/gh/someone/sinks/v2" in readme
    notebooks = len(list((copy / "notebooks").glob("[0-9]*.ipynb")))
    assert readme.count("https://colab.research.google.com/github/someone/sinks/blob/v2/notebooks/student/") == notebooks
    path = copy / "notebooks" / "01_kv_cache.ipynb"  # a hand edit is caught
    path.write_text(path.read_text().replace("someone/sinks", "someone/else"))
    assert main(["host", "--root", str(copy), "--check"]) == 2
    assert "01_kv_cache.ipynb: its Colab cell does not match pyproject.toml" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--repo", "github.com/x/y"], "--repo must be an https URL"),
    (["--repo", "https://github.com/x/y", "--branch=-rf"], "--branch must be a git branch name"),
    (["--check", "--repo", "https://github.com/x/y"], "--check writes nothing"),
])
def test_bad_settings_are_refused_and_nothing_is_written(copy, capsys, argv, message):
    before = (copy / "pyproject.toml").read_text()
    assert main(["host", "--root", str(copy), *argv]) == 2
    assert message in capsys.readouterr().err and (copy / "pyproject.toml").read_text() == before


def test_without_a_home_the_colab_cell_stops_with_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    with pytest.raises(SystemExit, match="does not say where it is hosted: set REPO above"):
        exec(host.colab_source(host.Host()), {})
