"""The science commands: ``reproductions`` (the table of the papers' results beside the course's, with verdicts),
``explore`` (notebooks run on the exploration split, their figures written for the threshold ledger) and
``reproduce --fresh SEED`` (every asserted claim re-run on a fresh draw of data). They need the ``instructor``
extra."""

from __future__ import annotations

import argparse

from course.cli.args import Command


# ----------------------------------------------------------------------------- reproductions
def _reproductions_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="source", action="append", default=None,
                   help="folder of executed notebooks, one column of the table each (give it twice: the FAST and the "
                        "full-size copies; default: ./outputs, written by run-course.sh --execute)")
    p.add_argument("--out", default="docs/reproductions.md", help="the page to write (default: docs/reproductions.md)")
    p.add_argument("--draws", default="docs/fresh",
                   help="folder of fresh draws (python -m course reproduce --fresh SEED), set beside the notebooks' "
                        "runs; with any, fresh-draws.md is written beside the page (default: docs/fresh)")
    p.add_argument("--json", action="store_true")


def _reproductions(args: argparse.Namespace) -> dict:
    from course.instructor.reproductions import write_reproductions

    result = write_reproductions(args.source or ["outputs"], args.out, args.draws)
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


# ----------------------------------------------------------------------------- fresh draws
def _fresh_seed(text: str) -> int:
    from course.cli.args import bounded_int
    from course.splits import SEED_BLOCK

    return bounded_int(text, 0, SEED_BLOCK - 1)


def _reproduce_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fresh", type=_fresh_seed, required=True, metavar="SEED",
                   help="the draw: passages, needles, passkeys and notebook 06's models from this seed's own stream "
                        "(0 .. 2**31 - 1)")
    p.add_argument("notebooks", nargs="*", help="notebooks to re-run (default: notebooks/02_* to 09_*)")
    p.add_argument("--executed", default=None,
                   help="folder for the executed copies (default: outputs-fresh/SEED)")
    p.add_argument("--out", default=None, help="folder for the rows and claims (default: docs/fresh/SEED)")
    p.add_argument("--json", action="store_true")


def _reproduce(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from course.instructor.fresh_draws import FRESH_DIR, NOTEBOOKS, fresh_draw_run

    paths = [Path(n) for n in args.notebooks] or sorted(Path("notebooks").glob(NOTEBOOKS))
    executed = Path(args.executed or f"outputs-fresh/{args.fresh}")
    out = Path(args.out) if args.out else FRESH_DIR / str(args.fresh)
    records = fresh_draw_run(args.fresh, paths, executed, out, progress=not args.json)
    if not args.json:
        for r in records:
            held = sum(c["held"] for c in r["claims"])
            print(f"{r['notebook']}: {len(r['rows'])} rows, claims held {held} of {len(r['claims'])} on fresh draw "
                  f"{args.fresh} ({r['seconds']} s, {r['commit']})")
        print(f"-> {out}; `python -m course reproductions` sets the draws beside the notebooks' own runs")
    return {"seed": args.fresh, "out": str(out), "notebooks": [r["notebook"] for r in records]}


COMMANDS = [
    Command("reproductions", "the reproduction table (paper vs course, verdicts) from executed notebooks",
            _reproductions_args, _reproductions),
    Command("explore", "run notebooks on the exploration split, claims recorded; their figures -> docs/exploration",
            _explore_args, _explore),
    Command("reproduce", "re-run every asserted claim of notebooks 02-09 on a fresh draw of data: --fresh SEED",
            _reproduce_args, _reproduce),
]
