"""Binder (repo2docker) and conda set up the course with the dependencies ``pyproject.toml`` declares.

repo2docker reads ``binder/`` (which then hides every file at the top level): ``environment.yml`` is solved
with conda first, then ``postBuild`` runs from the repository's root. Here: both environment files agree
with each other and with ``pyproject.toml`` on Python and torch, the rest comes from the package itself
(``pip install -e .[dev]``), and ``postBuild`` installs it and fetches the offline assets.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML (installed with papermill) reads the environment files")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
ENVIRONMENTS = [ROOT / "binder" / "environment.yml", ROOT / "environment.yml"]
CONDA_NAMES = {"pytorch-cpu": "torch", "pytorch": "torch"}  # conda package -> the distribution it installs


def conda_specs(path: Path) -> tuple[dict[str, str], list]:
    """(conda package -> version spec, pip entries) of an environment file."""
    env = yaml.safe_load(path.read_text(encoding="utf-8"))
    specs, pip = {}, []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip += dep.get("pip", [])
            continue
        name, spec = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", dep).groups()
        specs[name] = spec.lstrip("=") if spec.startswith("=") and not spec.startswith("==") else spec
    return specs, pip


def pyproject_spec(name: str) -> str:
    for dep in PYPROJECT["project"]["dependencies"]:
        m = re.fullmatch(rf"{re.escape(name)}\s*([<>=!~].*)", dep)
        if m:
            return m.group(1)
    raise AssertionError(f"pyproject.toml does not depend on {name}")


@pytest.mark.parametrize("path", ENVIRONMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_environment_files_agree_with_pyproject(path):
    env = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert env["channels"] == ["conda-forge"], "conda-forge alone: its pytorch-cpu is the torch the course uses"
    specs, pip = conda_specs(path)
    python = specs.pop("python")
    low = tuple(int(x) for x in re.fullmatch(r">=\s*(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"]).groups())
    assert tuple(int(x) for x in python.split(".")[:2]) >= low, f"{path.name}: python {python} < requires-python"
    torch = {CONDA_NAMES[n]: s for n, s in specs.items() if n in CONDA_NAMES}
    assert torch == {"torch": pyproject_spec("torch")}, f"{path.name}: torch {torch} vs pyproject"
    assert set(specs) - set(CONDA_NAMES) == {"pip"}, f"{path.name}: other conda packages {specs}: keep them in pyproject"
    # everything else is the package's own dependency list, installed by pip from pyproject.toml
    if path.parent.name == "binder":
        assert pip == [], "repo2docker solves binder/environment.yml before the repository is there: no -e ."
    else:
        assert pip == ['-e ".[dev]"'] or pip == ["-e .[dev]"], pip


def test_postbuild_installs_the_package_and_fetches_the_assets():
    post = ROOT / "binder" / "postBuild"
    assert os.access(post, os.X_OK), "repo2docker runs binder/postBuild as a program"
    lines = [ln.strip() for ln in post.read_text(encoding="utf-8").splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    assert lines[0] == "set -e" or lines[0].startswith("set -e"), "a failing step must fail the build"
    install = next(i for i, ln in enumerate(lines) if "pip install" in ln)
    assert re.search(r"""-e\s+["']?\.\[dev\]""", lines[install])
    fetch = next(i for i, ln in enumerate(lines) if ln.endswith("python -m course fetch"))
    assert install < fetch
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert set(extras["dev"]) >= {"jupyterlab>=4.0", "attention-sinks-course[instructor]"}, \
        "Binder opens JupyterLab from the dev extra"
    assert "ipykernel>=6.0" in extras["instructor"], "the kernel comes with the instructor extra, which dev includes"


def test_binder_has_no_second_configuration_that_repo2docker_would_ignore():
    ignored = {"requirements.txt", "Pipfile", "setup.py", "install.R", "Project.toml", "Dockerfile", "runtime.txt"}
    assert not ignored & {p.name for p in (ROOT / "binder").iterdir()}
