"""The package's two rooms and its map: what a student's kernel imports (``course`` minus ``course.instructor``)
never imports the instructor's tools, and ``course/__init__.py``'s map names every module.

The import graph is read from the source by ``course.instructor.architecture`` (every ``import`` statement, those
inside functions and under ``if TYPE_CHECKING:`` included); tests/test_structure.py holds it to having no circle."""

from __future__ import annotations

import json
import subprocess
import sys

import course
from course.instructor.architecture import PACKAGE, import_graph, module_files

# the command line is the one door to both rooms: its instructor commands (and bench's instructor runs) use the
# instructor's tools, so these modules, and what joins them, may import course.instructor
DOORS = {"course.__main__", "course.cli", "course.cli.bench", "course.cli.instructor", "course.cli.science"}
MODULES = module_files()
GRAPH = import_graph()


def _reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in GRAPH[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def _instructor(name: str) -> bool:
    return name == "course.instructor" or name.startswith("course.instructor.")


def test_the_graph_sees_lazy_imports():
    # the cli imports everything it runs inside functions
    assert "course.models" in GRAPH["course.cli.experiments"]
    assert "course.instructor.grading.grade" in GRAPH["course.cli.instructor"]


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
