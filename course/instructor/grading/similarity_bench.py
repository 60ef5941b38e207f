"""How long the similarity report takes for a large class: ``python -m course bench --similarity [--students 500]``.

A synthetic class: every student's copy of a notebook is its released copy (``notebooks/student``) with each
solution region's stub replaced by lines of their own (random statements of the region's length: names, numbers,
calls and operators drawn at random, so that no two students write the same code), except that about one student
in fifty copies another student's region (names renamed) and one in fifty pastes the course's solution. The
notebooks are written to a temporary folder and the report is made from the files, as ``grade`` makes it: reading,
extracting the written code, fingerprinting, the inverted index and the scoring all count. The result also says
how many of the planted copies were flagged (the honest, random work is never alike).
"""

from __future__ import annotations

import json
import random
import re
import tempfile
import time
from pathlib import Path

import nbformat

from course.instructor.grading.key import GradingKey, released_lines
from course.instructor.grading.similarity import COURSE, Entry, similarity_report, solution_lines

__all__ = ["synthetic_class", "bench_similarity", "similarity_table"]

COPY_RATE = 0.02  # share of students who copy a region from another student
PASTE_RATE = 0.02  # share of students who paste the course's solution of a region
_STUB = re.compile(r"^(\s*)raise NotImplementedError\(\)\s*$")
_CALLS = ["torch.cat", "torch.softmax", "torch.topk", "math.sqrt", "len", "max", "min", "sum", "abs", "int", "round",
          "torch.zeros", "torch.arange", "sorted", "torch.stack", "float", "torch.where", "range"]
_METHODS = ["sum", "mean", "argmax", "view", "reshape", "transpose", "clone", "max", "float", "item", "cumsum"]
_OPS = ["+", "-", "*", "/", "//", "%", "@", "**"]
_COMPARE = ["<", ">", "<=", ">=", "==", "!="]


def _name(rng: random.Random) -> str:
    return rng.choice("abcdefghkmnpqrstuvwxyz") + rng.choice(["", "_", "s", "2", "_new", "_old", "_all", "_sum"])


def _expr(rng: random.Random, depth: int = 2) -> str:
    r = rng.random()
    if depth == 0 or r < 0.25:
        return rng.choice([_name(rng), str(rng.randint(0, 999)), f"{_name(rng)}.shape[{rng.randint(-2, 2)}]",
                           f"{rng.random():.{rng.randint(1, 3)}f}"])
    if r < 0.5:
        return f"{_expr(rng, depth - 1)} {rng.choice(_OPS)} {_expr(rng, depth - 1)}"
    if r < 0.7:
        args = ", ".join(_expr(rng, depth - 1) for _ in range(rng.randint(1, 3)))
        keyword = f", {rng.choice(['dim', 'keepdim', 'k', 'out'])}={_expr(rng, 0)}" if rng.random() < 0.4 else ""
        return f"{rng.choice(_CALLS)}({args}{keyword})"
    if r < 0.85:
        return f"{_expr(rng, depth - 1)}.{rng.choice(_METHODS)}({_expr(rng, 0) if rng.random() < 0.5 else ''})"
    return f"{_expr(rng, depth - 1)}[{rng.choice([':', '', '...'])}{', ' if rng.random() < 0.5 else ''}{_expr(rng, 0)}]"


def _own_lines(rng: random.Random, count: int) -> list[str]:
    """``count`` statements (or a few more: a block counts its body) written at random."""
    out: list[str] = []
    while len(out) < count:
        r = rng.random()
        if r < 0.6:
            out.append(f"{_name(rng)} = {_expr(rng)}")
        elif r < 0.75:
            out += [f"if {_expr(rng, 1)} {rng.choice(_COMPARE)} {_expr(rng, 1)}:", f"    {_name(rng)} = {_expr(rng)}"]
        elif r < 0.9:
            out += [f"for {_name(rng)} in range({_expr(rng, 1)}):", f"    {_name(rng)} += {_expr(rng)}"]
        else:
            out.append(f"{_name(rng)}.append({_expr(rng)})")
    return out[:count] + [f"return {_expr(rng)}"]


def _renamed(lines: list[str], rng: random.Random) -> list[str]:
    """``lines`` with every one- or two-letter local name replaced (a disguise the filtered code sees through)."""
    mapping: dict[str, str] = {}

    def swap(match: re.Match) -> str:
        return mapping.setdefault(match.group(0), f"{_name(rng)}_{len(mapping)}")

    return [re.sub(r"\b[a-z][a-z0-9]?\b(?!\()", swap, line) for line in lines]


def _regions(solution: dict) -> list[list[str]]:
    """The lines of each solution region of a solution notebook (as JSON), dedented by the BEGIN line's indent."""
    regions = []
    for cell in solution.get("cells", ()):
        if cell.get("cell_type") != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        current: list[str] | None = None
        for line in source.splitlines():
            if "BEGIN SOLUTION" in line:
                current, indent = [], len(line) - len(line.lstrip())
            elif "END SOLUTION" in line and current is not None:
                regions.append(current)
                current = None
            elif current is not None:
                current.append(line[indent:])
    return regions


def _filled(released: dict, regions: list[list[str]]) -> dict:
    """The released copy (JSON) with its stubs, in order, replaced by ``regions`` (indented as the stub)."""
    nb = json.loads(json.dumps(released))
    work = iter(regions)
    for cell in nb["cells"]:
        if cell.get("cell_type") != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        lines = []
        for line in source.split("\n"):
            match = _STUB.match(line)
            region = next(work, None) if match else None
            lines += [match.group(1) + x for x in region] if region is not None else [line]
        cell["source"] = "\n".join(lines)
    return nb


def synthetic_class(folder: Path, notebooks: Path, numbers: list[str], students: int,
                    seed: int = 0) -> tuple[list[Entry], GradingKey, set[tuple[str, str, str]]]:
    """Write ``students`` synthetic submissions of each notebook in ``numbers`` into ``folder``/STUDENT/; returns
    the entries, the key (released lines and the course's solutions of those notebooks) and the planted copies
    (notebook, copier, source: another student or ``COURSE``)."""
    rng = random.Random(seed)
    entries, planted = [], set()
    key = GradingKey()
    names = [f"s{i:04d}" for i in range(students)]
    for number in numbers:
        [solution_path] = sorted(notebooks.glob(f"{number}_*.ipynb"))
        solution = json.loads(solution_path.read_text(encoding="utf-8"))
        released_text = (notebooks / "student" / solution_path.name).read_text(encoding="utf-8")
        released = json.loads(released_text)
        key.notebooks[number] = released_lines(nbformat.reads(released_text, as_version=4))
        key.solutions[number] = solution_lines(solution, frozenset(key.notebooks[number]))
        regions = _regions(solution)
        work: dict[str, list[list[str]]] = {}
        honest: list[str] = []  # the students who wrote their own: the sources of copies
        for student in names:
            own = [_own_lines(rng, max(1, len(r))) for r in regions]
            r = rng.random()
            if r < COPY_RATE and honest:
                source = rng.choice(honest)
                own = [_renamed(lines, rng) for lines in work[source]]
                planted.add((number, student, source))
            elif r < COPY_RATE + PASTE_RATE:
                own = [list(lines) for lines in regions]
                planted.add((number, student, COURSE))
            else:
                honest.append(student)
            work[student] = own
            path = folder / student / solution_path.name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(_filled(released, own)), encoding="utf-8")
            entries.append(Entry(student, number, path))
    return entries, key, planted


def bench_similarity(students: int = 500, notebooks: Path = Path("notebooks"), numbers: list[str] | None = None,
                     seed: int = 0) -> dict:
    """The similarity report's wall time for ``students`` synthetic submissions of one notebook (01) and of every
    notebook in ``numbers`` (default: all), and how many planted copies it flagged."""
    every = numbers or sorted(p.name[:2] for p in notebooks.glob("[0-9]*.ipynb"))
    runs = []
    for chosen in ([every[0]], every) if len(every) > 1 else ([every[0]],):
        with tempfile.TemporaryDirectory(prefix="course-bench-similarity-") as work:
            entries, key, planted = synthetic_class(Path(work), notebooks, chosen, students, seed)
            start = time.perf_counter()
            report = similarity_report(entries, key)
            seconds = time.perf_counter() - start
        flagged = {(p["notebook"], p["student_a"], p["student_b"]) for p in report["pairs"] if p["flagged"]}
        found = {(nb, a, b) for nb, a, b in planted if (nb, a, b) in flagged or (nb, b, a) in flagged}
        runs.append({"notebooks": chosen, "submissions": len(entries), "seconds": round(seconds, 2),
                     "pairs_listed": len(report["pairs"]), "flagged": len(flagged), "planted": len(planted),
                     "planted_flagged": len(found), "others_flagged": len(flagged) - len(found)})
    return {"students": students, "runs": runs}


def similarity_table(result: dict, command: str) -> str:
    """The measurements as a markdown table (with the command that repeats them)."""
    lines = [f"Measured by `{command}`:", "",
             "| notebooks | submissions | wall time | pairs listed | flagged | planted copies flagged "
             "| others flagged |",
             "|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        lines.append(f"| {', '.join(r['notebooks'])} | {r['submissions']} | {r['seconds']:.1f} s | "
                     f"{r['pairs_listed']} | {r['flagged']} | {r['planted_flagged']} of {r['planted']} | "
                     f"{r['others_flagged']} |")
    return "\n".join(lines)
