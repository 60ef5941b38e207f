"""The science commands: ``reproductions`` (the table of the papers' results beside the course's, with verdicts) and
``explore`` (notebooks run on the exploration split, their figures written for the threshold ledger). They need the
``instructor`` extra."""

from __future__ import annotations

import argparse

from course.cli.args import Command


# ----------------------------------------------------------------------------- reproductions
def _reproductions_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="source", action="append", default=None,
                   help="folder of executed notebooks, one column of the table each (give it twice: the FAST and the "
                        "full-size copies; default: ./outputs, written by run-course.sh --execute)")
    p.add_argument("--out", default="docs/reproductions.md", help="the page to write (default: docs/reproductions.md)")
    p.add_argument("--json", action="store_true")


def _reproductions(args: argparse.Namespace) -> dict:
    from course.instructor.reproductions import write_reproductions

    result = write_reproductions(args.source or ["outputs"], args.out)
    if not args.json:
        counts = "; ".join(f"{name}: " + ", ".join(f"{n} {v}" for v, n in c.items())
                           for name, c in result["columns"].items())
        print(f"{result['rows']} rows (reproductions {counts}) -> {result['out']}")
    return result


# ----------------------------------------------------------------------------- exploration
def _explore_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("notebooks", nargs="*", help="notebooks to explore (default: notebooks/02_* to 06_*)")
    p.add_argument("--executed", default="outputs-exploration",
                   help="folder for the executed exploration copies (default: outputs-exploration)")
    p.add_argument("--out", default=None, help="folder for the figures (default: docs/exploration)")
    p.add_argument("--json", action="store_true")


def _explore(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from course.instructor.exploration import EXPLORATION_DIR, explore

    paths = [Path(n) for n in args.notebooks] or sorted(Path("notebooks").glob("0[2-6]_*.ipynb"))
    records = explore(paths, Path(args.executed), Path(args.out) if args.out else EXPLORATION_DIR)
    if not args.json:
        for r in records:
            print(f"{r['notebook']}: {len(r['rows'])} rows, {len(r['claims'])} claims on the exploration split "
                  f"({r['seconds']} s, {r['commit']})")
    return {"notebooks": [r["notebook"] for r in records]}


COMMANDS = [
    Command("reproductions", "the reproduction table (paper vs course, verdicts) from executed notebooks",
            _reproductions_args, _reproductions),
    Command("explore", "run notebooks on the exploration split, claims recorded; their figures -> docs/exploration",
            _explore_args, _explore),
]
