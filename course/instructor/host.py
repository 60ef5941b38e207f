"""Where the course lives: one setting, from which the notebooks' Colab cell and the README's links follow.

    python -m course host --repo https://github.com/OWNER/attention-sinks-course [--branch main]
    python -m course host --check        # the Colab cells and the README agree with the setting

The setting is ``Repository`` under ``[project.urls]`` in ``pyproject.toml`` (the branch: ``branch`` under
``[tool.attention-sinks-course]``). ``host`` writes it, rewrites every solution notebook's ``colab`` cell
(the first code cell, run only on Colab, which installs the course from that repository) and the README's
block between ``<!-- host:begin -->`` and ``<!-- host:end -->`` (Open in Colab and Binder links); then
``python -m course release`` carries the cell into the student copies. With no repository set, the Colab
cell stops with one line saying what to set, instead of failing inside pip.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Host", "read_host", "write_host", "colab_source", "readme_block", "apply", "check"]

COLAB_TAG = "colab"
BEGIN, END = "<!-- host:begin -->", "<!-- host:end -->"
TOOL_TABLE = "tool.attention-sinks-course"


@dataclass(frozen=True)
class Host:
    """The repository URL ("" when not set) and its branch."""

    repo: str = ""
    branch: str = "main"

    @property
    def github(self) -> tuple[str, str] | None:
        """(owner, name) when the repository is on GitHub (Colab and Binder links need it)."""
        m = re.fullmatch(r"https://github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?", self.repo)
        return (m.group(1), m.group(2)) if m else None


def _check(host: Host) -> Host:
    if host.repo and not re.fullmatch(r"https://[\w.-]+(/[\w.@%+-]+)+/?", host.repo):
        raise ValueError(f"--repo must be an https URL of a git repository (https://github.com/OWNER/NAME), "
                         f"got {host.repo!r}")
    if not re.fullmatch(r"[\w./-]+", host.branch) or host.branch.startswith(("-", "/")):
        raise ValueError(f"--branch must be a git branch name, got {host.branch!r}")
    return host


def read_host(root: Path) -> Host:
    """The setting in ``root/pyproject.toml``."""
    data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    repo = data.get("project", {}).get("urls", {}).get("Repository", "")
    branch = data.get("tool", {}).get("attention-sinks-course", {}).get("branch", "main")
    return _check(Host(repo, branch))


def write_host(root: Path, host: Host) -> None:
    """Write the setting into ``root/pyproject.toml`` (the two tables are rewritten, the rest is kept)."""
    _check(host)
    path = root / "pyproject.toml"
    text = path.read_text(encoding="utf-8")
    for table, key, value in (("project.urls", "Repository", host.repo), (TOOL_TABLE, "branch", host.branch)):
        block = f"[{table}]\n{key} = {json.dumps(value)}\n"
        pattern = re.compile(rf"^\[{re.escape(table)}\]\n(?:(?!\[).*\n)*", re.M)
        text = pattern.sub(block + "\n", text, count=1) if pattern.search(text) else text.rstrip("\n") + "\n\n" + block
    tomllib.loads(text)  # still valid TOML
    path.write_text(text, encoding="utf-8")


def colab_source(host: Host) -> str:
    """The source of every notebook's Colab cell for ``host``."""
    return (
        "# Colab only: install the course package and fetch its offline assets (torch is kept as it is).\n"
        "# Written by `python -m course host` from pyproject.toml: change it there, not here.\n"
        "import sys\n"
        'if "google.colab" in sys.modules:\n'
        f"    REPO, BRANCH = {json.dumps(host.repo)}, {json.dumps(host.branch)}\n"
        "    if not REPO:\n"
        '        raise SystemExit("This copy of the course does not say where it is hosted: set REPO above to its git URL "\n'
        '                         "(or run `python -m course host --repo URL` in the repository).")\n'
        "    import subprocess\n"
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"git+{REPO}@{BRANCH}"], check=True)\n'
        '    subprocess.run([sys.executable, "-m", "course", "fetch"], check=True)'
    )


def readme_block(host: Host, notebooks: list[str]) -> str:
    """The README's links for ``host`` (between the markers)."""
    gh = host.github
    if gh is None:
        body = ("Where this course is hosted is not set, so there are no Colab or Binder links yet: run "
                "`python -m course host --repo https://github.com/OWNER/NAME` in the repository.")
        if host.repo:
            body = (f"The course is hosted at {host.repo} (branch `{host.branch}`); Colab and Binder links are made "
                    "for GitHub repositories only.")
    else:
        owner, name = gh
        binder = f"https://mybinder.org/v2/gh/{owner}/{name}/{host.branch}"
        rows = [f"[![Binder](https://mybinder.org/badge_logo.svg)]({binder}) — the whole course in JupyterLab, "
                "nothing to install.", "", "| notebook | Colab (student copy) |", "|---|---|"]
        for nb in notebooks:
            url = f"https://colab.research.google.com/github/{owner}/{name}/blob/{host.branch}/notebooks/student/{nb}"
            rows.append(f"| `{nb.removesuffix('.ipynb')}` | [![Open in Colab](https://colab.research.google.com/"
                        f"assets/colab-badge.svg)]({url}) |")
        body = "\n".join(rows)
    return f"{BEGIN}\n{body}\n{END}"


def _solution_notebooks(root: Path) -> list[Path]:
    return sorted((root / "notebooks").glob("[0-9]*.ipynb"))


def _colab_cell(nb: dict, path: Path) -> dict:
    cells = [c for c in nb["cells"] if COLAB_TAG in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"{path} must have exactly one cell tagged {COLAB_TAG!r}, found {len(cells)}")
    return cells[0]


def _lines(source: str) -> list[str]:
    parts = source.split("\n")
    return [p + "\n" for p in parts[:-1]] + [parts[-1]]


def check(root: Path) -> list[str]:
    """What disagrees with the setting: one line per notebook or README out of date ([] when in sync)."""
    host = read_host(root)
    problems = []
    for path in _solution_notebooks(root):
        cell = _colab_cell(json.loads(path.read_text(encoding="utf-8")), path)
        if "".join(cell["source"]) != colab_source(host):
            problems.append(f"{path}: its Colab cell does not match pyproject.toml")
    readme = (root / "README.md").read_text(encoding="utf-8")
    if readme_block(host, [p.name for p in _solution_notebooks(root)]) not in readme:
        problems.append(f"{root / 'README.md'}: the block between {BEGIN} and {END} does not match pyproject.toml")
    return problems


def apply(root: Path, host: Host | None = None) -> list[Path]:
    """Write ``host`` (default: keep the current setting) and bring the notebooks and the README in line.
    Returns the files changed. Run ``python -m course release`` afterwards for the student copies."""
    changed = []
    if host is not None:
        write_host(root, host)
        changed.append(root / "pyproject.toml")
    host = read_host(root)
    for path in _solution_notebooks(root):
        nb = json.loads(path.read_text(encoding="utf-8"))
        cell = _colab_cell(nb, path)
        if "".join(cell["source"]) != colab_source(host):
            cell["source"] = _lines(colab_source(host))
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            changed.append(path)
    readme_path = root / "README.md"
    readme = readme_path.read_text(encoding="utf-8")
    block = readme_block(host, [p.name for p in _solution_notebooks(root)])
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"{readme_path} has no {BEGIN} … {END} block to write the links into")
    new = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda m: block, readme, count=1, flags=re.S)
    if new != readme:
        readme_path.write_text(new, encoding="utf-8")
        changed.append(readme_path)
    return changed
