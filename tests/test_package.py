"""The package's two rooms and its map: what a student's kernel imports (``course`` minus ``course.instructor``)
never imports the instructor's tools, no import cycle hides behind a lazy import, and ``course/__init__.py``'s
map names every module.

The import graph is read from the source (every ``import`` statement, those inside functions included; only
those under ``if TYPE_CHECKING:`` are left out, as they never run)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import course

PACKAGE = Path(course.__file__).parent
# the command line is the one door to both rooms: its instructor commands (and bench's instructor runs) use the
# instructor's tools, so these modules, and what joins them, may import course.instructor
DOORS = {"course.__main__", "course.cli", "course.cli.bench", "course.cli.instructor"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:`` (never run)."""
    hidden = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            hidden |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return hidden


def imports_of(name: str) -> set[str]:
    """The course modules ``name`` imports anywhere in its source (a ``from X import Y`` names ``X.Y`` when that
    is a module, else ``X``)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    hidden = _type_checking_only(tree)
    out = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names if alias.name in MODULES}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in MODULES else base)
    return {m for m in out if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def _reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in GRAPH[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (every import cycle lies in one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def _instructor(name: str) -> bool:
    return name == "course.instructor" or name.startswith("course.instructor.")


def test_the_graph_sees_lazy_imports_and_skips_type_checking_ones():
    # policies imports LayerCache only for a type hint; the cli imports everything it runs inside functions
    assert "course.kvcache" not in GRAPH["course.policies"]
    assert "course.models" in GRAPH["course.cli.experiments"]
    assert "course.instructor.grading.grade" in GRAPH["course.cli.instructor"]


def test_no_import_cycle():
    assert _cycles() == []


def test_the_student_room_never_reaches_the_instructors():
    student = [m for m in MODULES if not _instructor(m) and m not in DOORS]
    assert "course.exercises.serve" in student and "course.widgets" in student
    reaches = {m: sorted(filter(_instructor, _reachable(m))) for m in student}
    assert {m: r for m, r in reaches.items() if r} == {}


def test_a_student_kernels_imports_load_nothing_of_the_instructors():
    """The same at run time: every module of the student room imported in one fresh interpreter."""
    student = [m for m in MODULES if not _instructor(m) and m not in DOORS and m != "course.__main__"]
    code = ("import importlib, json, sys\n"
            f"for m in {student!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('course.instructor'))))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         cwd=PACKAGE.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []


def test_the_package_map_names_every_module():
    """``course/__init__.py``'s docstring names every module and subpackage (top level) by its path."""
    doc = course.__doc__ or ""
    top = sorted({name.split(".")[1] for name in MODULES if name.count(".") >= 1} - {"__main__"})
    missing = [name for name in top if f"``course.{name}``" not in doc]
    assert missing == []
    named = {word.split(".")[1].rstrip("`") for word in doc.replace("``", " ").split() if word.startswith("course.")}
    assert named - set(top) == set(), "the map names modules that do not exist"
