"""The solution notebooks, read as the instructor's source of truth for the exercises.

* ``exercise_cells(nb)``: for every ``check("NN.name", fn, ...)`` cell, the solution cell that defines ``fn``;
* ``solution_functions(path)``: the solutions as functions (the notebook's imports and its solution cells' function
  definitions, run in one namespace in notebook order, so that a solution may call an earlier one);
* ``paste_solutions(student, solution)``: a released student copy filled in as an honest student would, each
  exercise's region replaced by the solution's lines (markers dropped), nothing else changed: a graded copy keeps
  its own questions (its numbers, its order of options), and a choice is made by the option's text, under the
  copy's letter for it;
* ``printed_options(nb)`` and the readers of the questions' cell (``understanding``, ``question_paragraph``,
  ``split_options``): the questions as a notebook prints them.

Nothing here is imported by a notebook or installed for students to use: the solutions live in the solution
notebooks, never in ``course``.
"""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course.exercises.questions import BY_ID as QUESTION

__all__ = ["ExerciseCell", "exercise_cells", "solution_functions", "paste_solutions", "without_markers", "is_marker",
           "solution_pieces", "printed_options", "understanding", "question_paragraph", "split_options",
           "UNDERSTANDING"]

UNDERSTANDING = "## Check your understanding"  # the heading of the markdown cell that prints the questions

_CHECK = re.compile(r'(\w+)\s*=\s*check\(\s*"(\d\d\.\w+)"\s*,\s*(\w+)')
_MARKER = re.compile(r"^\s*#*\s*(BEGIN|END) SOLUTION\s*$")


@dataclass(frozen=True)
class ExerciseCell:
    id: str  # "02.window_stream_nll"
    name: str  # the function the check cell hands over
    solution: int  # index of the code cell that defines it (with its solution region)
    check: int  # index of the check cell


def exercise_cells(nb: nbformat.NotebookNode) -> dict[str, ExerciseCell]:
    """Every checked exercise of a solution (or student) notebook, by id."""
    found = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for match in _CHECK.finditer(cell.source):
            name = match.group(3)
            defining = [i for i in range(index) if nb.cells[i].cell_type == "code"
                        and re.search(rf"^\s*def {name}\(", nb.cells[i].source, re.M)]
            if not defining:
                raise ValueError(f"{match.group(2)}: no cell before the check cell defines {name}()")
            found[match.group(2)] = ExerciseCell(match.group(2), name, defining[-1], index)
    return found


def without_markers(source: str) -> str:
    """A solution cell as a student would have typed it: the region's lines without the marker lines."""
    return "\n".join(line for line in source.split("\n") if not _MARKER.match(line))


def _definitions(source: str) -> str:
    """The imports and function definitions of a cell (whatever else it runs is left out)."""
    tree = ast.parse(source)
    kept = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef))]
    return ast.unparse(ast.Module(body=kept, type_ignores=[]))


def _imports(source: str) -> str:
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a cell with IPython magics: it imports nothing a solution needs
        return ""
    kept = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    return ast.unparse(ast.Module(body=kept, type_ignores=[]))


def solution_functions(path: Path) -> dict[str, Callable]:
    """{exercise id: its solution function} of one solution notebook."""
    nb = nbformat.read(path, as_version=4)
    cells = exercise_cells(nb)
    namespace: dict = {"__name__": f"solutions_{path.stem}"}
    for cell in nb.cells:
        if cell.cell_type == "code":
            exec(compile(_imports(cell.source), str(path), "exec"), namespace)
    for index in sorted({c.solution for c in cells.values()}):
        exec(compile(_definitions(nb.cells[index].source), f"{path.name}, cell {index + 1}", "exec"), namespace)
    return {ex.id: namespace[ex.name] for ex in cells.values()}


def is_marker(line: str, marker: str, cell_type: str) -> bool:
    """The markers' rule (release's, nbgrader's): a line naming the marker; in markdown, outside backticks (quoted
    code mentions markers, it is not one)."""
    if cell_type == "markdown":
        line = re.sub(r"`+[^`]*`+", "", line)
    return marker in line


def solution_pieces(source: str, cell_type: str) -> list[str | list[str]]:
    """A solution cell as release sees it: each line outside a solution region (a str), each region's lines
    without its markers (a list), in order; a student copy has one line per piece."""
    BEGIN, END = "BEGIN SOLUTION", "END SOLUTION"
    pieces: list[str | list[str]] = []
    region: list[str] | None = None
    for line in source.split("\n"):
        if is_marker(line, BEGIN, cell_type):
            region = []
            pieces.append(region)
        elif is_marker(line, END, cell_type):
            region = None
        elif region is not None:
            region.append(line)
        else:
            pieces.append(line)
    return pieces


def _pasted(student: str, solution: str, cell_type: str) -> str:
    """The student's cell with each region as the solution has it; the solution's cell, markers dropped, when the
    two do not line up."""
    pieces, lines = solution_pieces(solution, cell_type), student.split("\n")
    if len(pieces) != len(lines):
        return without_markers(solution)
    out: list[str] = []
    for piece, line in zip(pieces, lines):
        out.extend(piece if isinstance(piece, list) else [line])
    return "\n".join(out)


def understanding(nb: nbformat.NotebookNode) -> nbformat.NotebookNode | None:
    """The markdown cell that prints the notebook's questions (None when it has none)."""
    return next((c for c in nb.cells if c.cell_type == "markdown" and UNDERSTANDING in c.source), None)


def question_paragraph(source: str, number: int) -> re.Match | None:
    """Question ``number``'s paragraph in the questions' cell: group 1 is its text after ``**number.** ``."""
    return re.search(rf"^\*\*{number}\.\*\* (.*?)(?=\n[ \t]*\n|\Z)", source, re.S | re.M)


def split_options(paragraph: str) -> tuple[str, dict[str, str]] | None:
    """(the question before its options, {letter: option}) of a choice question's paragraph (its options on the
    last line, ``(a) ...  (b) ...``)."""
    head, _, last = paragraph.rpartition("\n")
    if not last.startswith("(a) "):
        return None
    parts = re.split(r"  (?=\([a-e]\) )", last)
    options = {}
    for part in parts:
        m = re.fullmatch(r"\(([a-e])\) (.*)", part, re.S)
        if m is None:
            return None
        options[m.group(1)] = m.group(2)
    return head, options


def printed_options(nb: nbformat.NotebookNode) -> dict[str, dict[str, str]]:
    """{question id: {letter: option}} of every choice question the notebook prints."""
    cell = understanding(nb)
    out = {}
    for qid, ex in exercise_cells(nb).items():
        if qid in QUESTION and QUESTION[qid].kind == "choice" and cell is not None and ex.name[1:].isdigit():
            m = question_paragraph(cell.source, int(ex.name[1:]))
            parsed = split_options(m.group(1)) if m else None
            if parsed:
                out[qid] = parsed[1]
    return out


_LETTER = re.compile(r"""(return\s+)(["'])([a-e])\2""")


def paste_solutions(student: nbformat.NotebookNode, solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The student copy with every solution region (code and text) as the solution notebook has it, markers
    dropped, each cell's other lines as the copy has them; cells are matched by id. A choice question's answer is
    the letter the copy prints the solution's option under. Returns a new notebook."""
    filled = copy.deepcopy(student)
    by_id = {cell.get("id"): cell for cell in solution.cells}
    for cell in filled.cells:
        source = by_id.get(cell.get("id"))
        if source is not None and "BEGIN SOLUTION" in source.source:
            cell.source = _pasted(cell.source, source.source, cell.cell_type)
    shown, printed = printed_options(filled), printed_options(solution)
    for qid, ex in exercise_cells(filled).items():
        if qid in shown and qid in printed:
            letter_of = {text: letter for letter, text in shown[qid].items()}
            relettered = {old: letter_of.get(text, old) for old, text in printed[qid].items()}
            cell = filled.cells[ex.solution]
            cell.source = _LETTER.sub(lambda m: m.group(1) + m.group(2) + relettered.get(m.group(3), m.group(3))
                                      + m.group(2), cell.source)
    return filled
