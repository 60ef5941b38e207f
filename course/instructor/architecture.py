"""The structure of the ``course`` package, read from its code: who imports whom, the layers that follow, and the
rooms that are too large.

* ``import_graph``: every import of a course module by a course module, wherever it stands (at the top, inside a
  function, under ``if TYPE_CHECKING:``): a lazy import still ties the two modules together, so it counts.
* ``circles``: the groups of modules that import each other, directly or round a loop (none is the rule).
* ``layers``: the packages and top-level modules of ``course`` in levels: level 0 imports nothing of the course,
  level n imports only what lies below it. A circle between packages is drawn as one box naming its members.
* ``mermaid`` / ``write_page``: the picture of docs/architecture.md (``python -m course architecture [--check]``);
  each arrow is an import that no longer path implies (the transitive reduction), so the page stays readable.
* ``long_modules`` / ``long_functions``: modules over ``MAX_MODULE_LINES`` lines, functions over
  ``MAX_FUNCTION_LINES`` (tests/test_structure.py holds the course to both).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

__all__ = ["MAX_MODULE_LINES", "MAX_FUNCTION_LINES", "module_files", "import_graph", "circles", "group_of",
           "layers", "mermaid", "write_page", "long_modules", "long_functions"]

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
PACKAGE = Path(__file__).resolve().parents[1]  # course/
BEGIN = "<!-- drawn by `python -m course architecture` from the imports of course/: do not edit by hand -->"
END = "<!-- end of the drawing -->"


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """{dotted name: file} of every module of the package (a package's ``__init__.py`` under the package's name)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(node: ast.Import | ast.ImportFrom, here: str, is_package: bool) -> Iterator[str]:
    """The dotted names an import statement names: modules, or (``from m import x``) ``m.x``, which is the module
    ``m.x`` or a name defined in ``m``."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:  # a relative import: resolved against this module's package
        anchor = here.split(".")[: len(here.split(".")) - node.level + int(is_package)]
        base = ".".join(anchor + ([base] if base else []))
    yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the course modules it imports}, with every import statement of the file counted."""
    files = module_files(package)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for dotted in _imported(node, name, path.name == "__init__.py"):
                    # "from course.x import y": y is a module of its own, or a name defined in course.x
                    while dotted and dotted not in files:
                        dotted = dotted.rpartition(".")[0]
                    if dotted and dotted != package.name and dotted != name:
                        targets.add(dotted)
        graph[name] = targets
    return graph


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            nxt = next((s for s in successors if s not in index or s in on_stack), None)
            if nxt is not None and nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt is not None:
                low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    out.append(sorted(component))
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that import each other round a loop (sorted lists), largest first."""
    found = [c for c in _components(graph) if len(c) > 1 or c[0] in graph[c[0]]]
    return sorted(found, key=lambda c: (-len(c), c))


def group_of(module: str) -> str:
    """The box a module is drawn in: its top-level package (``course.models``), or the module itself."""
    return ".".join(module.split(".")[:2])


def _grouped(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between boxes; boxes that import each other round a loop merge into one, named by
    its members joined with " + "."""
    boxes: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if "." in module:  # the package's own __init__ (its map and version) is not a room of its own
            boxes.setdefault(group_of(module), set()).update(group_of(t) for t in targets)
    merged = {member: " + ".join(c) for c in _components(boxes) for member in c}
    out: dict[str, set[str]] = {}
    for box, targets in boxes.items():
        out.setdefault(merged[box], set()).update(merged[t] for t in targets if merged[t] != merged[box])
    return out


def layers(graph: dict[str, set[str]]) -> tuple[dict[str, int], dict[str, set[str]]]:
    """({box: level}, the box graph): level 0 imports nothing of the course, level n what lies below n only."""
    boxes = _grouped(graph)
    level: dict[str, int] = {}

    def depth(box: str) -> int:
        if box not in level:
            level[box] = 1 + max((depth(t) for t in boxes[box]), default=-1)
        return level[box]

    for box in sorted(boxes):
        depth(box)
    return level, boxes


def _reduced(boxes: dict[str, set[str]]) -> dict[str, set[str]]:
    """The transitive reduction of an acyclic graph: an edge stays when no longer path joins its ends."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), list(boxes[start])
        while todo:
            box = todo.pop()
            if box not in seen:
                seen.add(box)
                todo.extend(boxes[box])
        return seen

    return {box: {t for t in targets if not any(t in reach(o) for o in targets - {t})}
            for box, targets in boxes.items()}


def _node_id(box: str) -> str:
    return box.replace(" + ", "__").replace(".", "_")


def mermaid(graph: dict[str, set[str]]) -> str:
    """The layers as a mermaid flowchart: one subgraph per level (the highest on top), arrows from importer to
    imported, without the arrows a longer path implies."""
    level, boxes = layers(graph)
    lines = ["```mermaid", "flowchart TB"]
    for n in sorted(set(level.values()), reverse=True):
        lines.append(f'  subgraph level{n}["level {n}"]')
        lines.extend(f'    {_node_id(box)}["{box}"]' for box in sorted(b for b in level if level[b] == n))
        lines.append("  end")
    for box, targets in sorted(_reduced(boxes).items()):
        lines.extend(f"  {_node_id(box)} --> {_node_id(t)}" for t in sorted(targets))
    lines.append("```")
    return "\n".join(lines) + "\n"


def write_page(page: Path, package: Path = PACKAGE, check: bool = False) -> bool:
    """Put the drawing of ``package`` between the page's markers; with ``check`` write nothing. Returns whether
    the page already held this drawing."""
    text = page.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise ValueError(f"{page} has no place for the drawing (the lines {BEGIN!r} and {END!r})")
    head, rest = text.split(BEGIN, 1)
    fresh = head + BEGIN + "\n" + mermaid(import_graph(package)) + END + rest.split(END, 1)[1]
    if fresh != text and not check:
        page.write_text(fresh, encoding="utf-8")
    return fresh == text


def long_modules(package: Path = PACKAGE, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """{module: lines} of the modules over ``limit`` lines."""
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in module_files(package).items()}
    return {name: n for name, n in sizes.items() if n > limit}


def long_functions(package: Path = PACKAGE, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """{"module:function (line)": lines} of the functions and methods over ``limit`` lines (``def`` to last line)."""
    out = {}
    for name, path in module_files(package).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    out[f"{name}:{node.name} (line {node.lineno})"] = length
    return out
