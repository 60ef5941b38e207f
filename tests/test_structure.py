"""The structure of ``course/``: no import circle, no module over 400 lines, no function over 60, and
docs/architecture.md draws the imports as they are (``course.instructor.architecture``).

Every import counts for the circles: at the top of a module, inside a function (a lazy import that breaks a circle
at run time is still a circle to the reader) and under ``if TYPE_CHECKING:`` (a type named from a higher floor is a
dependency on it). Each failure lists every offender, not the first."""

from __future__ import annotations

from pathlib import Path

import pytest

from course.instructor.architecture import (
    MAX_FUNCTION_LINES,
    MAX_MODULE_LINES,
    circles,
    import_graph,
    layers,
    long_functions,
    long_modules,
    mermaid,
    write_page,
)

ROOT = Path(__file__).resolve().parents[1]


def _listing(found: dict[str, int]) -> str:
    return "\n".join(f"  {name}: {n} lines" for name, n in sorted(found.items(), key=lambda kv: -kv[1]))


def test_no_import_circle_in_course():
    found = circles(import_graph())
    assert found == [], "import circles in course/ (every import counts):\n" + "\n".join(
        "  " + " <-> ".join(c) for c in found)


def test_no_module_over_the_limit():
    found = long_modules()
    assert found == {}, f"modules over {MAX_MODULE_LINES} lines:\n{_listing(found)}"


def test_no_function_over_the_limit():
    found = long_functions()
    assert found == {}, f"functions over {MAX_FUNCTION_LINES} lines:\n{_listing(found)}"


def test_the_architecture_page_draws_the_imports_as_they_are():
    assert write_page(ROOT / "docs" / "architecture.md", check=True), \
        "docs/architecture.md is stale: run `python -m course architecture` and commit it"


# ----------------------------------------------------------------------------- the reader, on a made-up package
FILES = {
    "__init__.py": "",
    "low.py": "import os\n\nVALUE = 1\n",
    "mid.py": "from pkg.low import VALUE\nfrom pkg import low\n",
    "top.py": "from . import mid\nfrom .sub.leaf import thing\nfrom pkg.low import VALUE\n",
    "lazy_a.py": "from pkg.low import VALUE\n\n\ndef f():\n    from pkg import lazy_b\n    return lazy_b\n",
    "lazy_b.py": "import pkg.lazy_a\n",
    "typed_a.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.typed_b import B\n",
    "typed_b.py": "from pkg.typed_a import A\n",
    "sub/__init__.py": "",
    "sub/leaf.py": "from ..low import VALUE\n\nthing = VALUE\n",
}


@pytest.fixture
def package(tmp_path) -> Path:
    root = tmp_path / "pkg"
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_the_graph_counts_every_import_wherever_it_stands(package):
    graph = import_graph(package)
    assert graph["pkg.mid"] == {"pkg.low"}  # a name of low, and low itself: one edge
    assert graph["pkg.top"] == {"pkg.mid", "pkg.sub.leaf", "pkg.low"} and graph["pkg.sub.leaf"] == {"pkg.low"}
    assert graph["pkg.low"] == set()  # os is not the package's
    assert circles(graph) == [["pkg.lazy_a", "pkg.lazy_b"], ["pkg.typed_a", "pkg.typed_b"]]


def test_layers_put_each_box_above_what_it_imports_and_merge_a_circle(package):
    level, boxes = layers(import_graph(package))
    assert level["pkg.low"] == 0 and level["pkg.sub"] == 1 and level["pkg.mid"] == 1 and level["pkg.top"] == 2
    assert level["pkg.lazy_a + pkg.lazy_b"] == 1 and boxes["pkg.lazy_a + pkg.lazy_b"] == {"pkg.low"}
    drawing = mermaid(import_graph(package))
    assert drawing.startswith("```mermaid\nflowchart TB\n") and 'pkg_top["pkg.top"]' in drawing
    assert "pkg_top --> pkg_mid" in drawing and "pkg_top --> pkg_low" not in drawing  # implied by top -> mid -> low


def test_the_page_must_have_its_markers(tmp_path, package):
    page = tmp_path / "page.md"
    page.write_text("# no drawing here\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has no place for the drawing"):
        write_page(page, package)
