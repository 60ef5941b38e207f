"""The instructor's commands: ``host``, ``release``, ``grade``, ``gradebook``, ``check-outputs`` and ``site`` (they
need the ``instructor`` extra), ``notebooks`` (the syllabus with its points) and ``architecture``
(docs/architecture.md's drawing)."""

from __future__ import annotations

import argparse

from course.cli.args import Command, check_out_folder, jobs_count, positive_int, seed_int


# ----------------------------------------------------------------------------- host
def _host_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repo", default=None, help="the course's git repository, e.g. https://github.com/OWNER/NAME")
    p.add_argument("--branch", default=None, help="its branch (default: the current setting, else main)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 2 if a notebook or the README disagrees")
    p.add_argument("--root", default=".", help="the repository's folder (default: .)")
    p.add_argument("--json", action="store_true")


def _host(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from course.instructor import host

    root = Path(args.root)
    if not (root / "pyproject.toml").is_file():
        raise ValueError(f"--root {args.root!r} is not the course's repository (no pyproject.toml)")
    current = host.read_host(root)
    if args.check:
        if args.repo or args.branch:
            raise ValueError("--check writes nothing: drop --repo and --branch")
        problems = host.check(root)
        if problems:
            raise RuntimeError("; ".join(problems) + "; run `python -m course host` and `python -m course release`")
        if not args.json:
            print(f"in sync with pyproject.toml (repository {current.repo or 'not set'}, branch {current.branch})")
        return {"repo": current.repo, "branch": current.branch, "in_sync": True}
    wanted = None
    if args.repo is not None or args.branch is not None:
        wanted = host.Host(current.repo if args.repo is None else args.repo, args.branch or current.branch)
    changed = host.apply(root, wanted)
    if not args.json:
        for path in changed:
            print(f"wrote {path}")
        print("now run `python -m course release` to update the student copies")
    return {"repo": host.read_host(root).repo, "branch": host.read_host(root).branch,
            "written": [str(p) for p in changed]}


# ----------------------------------------------------------------------------- release
def _release_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--notebooks", default="notebooks", help="folder of the solution notebooks (default: ./notebooks)")
    p.add_argument("--out", default=None, help="folder for the student copies (default: <notebooks>/student)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit with an error listing the student copies that are not up to date")
    p.add_argument("--hide-answers", action="store_true",
                   help="for graded use: a question's check says only whether the answer is well-formed (the grader "
                        "decides); write the copies to another folder with --out (the committed ones keep the hints)")
    p.add_argument("--key", default=None, metavar="FILE",
                   help="also write the grading key of this release (answers, the capstone's held-out passages, the "
                        "released lines) to FILE, outside --out: keep it from the students, grade with it. The release "
                        "is an exam of its own: each question in a variant drawn for it (options reordered, numbers "
                        "drawn), which its copies show and its key answers")
    p.add_argument("--seed", type=seed_int, default=None,
                   help="with --key: draw the questions' variants and the capstone's held-out passages from this seed "
                        "(default: a secret one, kept in the key); the same seed gives the same exam")
    p.add_argument("--json", action="store_true")


def _release(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from course.instructor import require

    require("release", "nbformat")
    from course.instructor.release import check_release, release

    solutions = Path(args.notebooks)
    students = Path(args.out) if args.out else solutions / "student"
    if args.check:
        problems = check_release(solutions, students)
        if problems:
            listing = "\n".join(f"{d.path} ({d.problem})" for d in problems)
            raise RuntimeError(f"the student copies are not up to date (run `python -m course release`)\n{listing}")
        if not args.json:
            print(f"the student copies in {students} are up to date")
        return {"student_dir": str(students), "up_to_date": True}
    key = Path(args.key) if args.key else None
    written = release(solutions, students, hidden_answers=args.hide_answers, key_path=key, seed=args.seed)
    if not args.json:
        for path in written:
            print(f"wrote {path}")
        if key:
            print(f"wrote the grading key {key} (keep it from the students; grade with --key {key})")
    return {"student_dir": str(students), "written": [str(p) for p in written], "key": str(key) if key else None}


# ----------------------------------------------------------------------------- grade
def _grade_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="submitted notebooks, or class folders searched recursively for *.ipynb")
    p.add_argument("--key", required=True, metavar="FILE",
                   help="the grading key that `python -m course release --key FILE` wrote with the copies handed out")
    p.add_argument("--layout", choices=["folders", "flat"], default="folders",
                   help="who a notebook belongs to: folders (default): PATH/STUDENT/.../NN_name.ipynb; "
                        "flat: PATH/STUDENT__NN_name.ipynb (see docs/grading.md)")
    p.add_argument("--timeout", type=positive_int, default=300, help="seconds each cell may run (default 300)")
    p.add_argument("--total-timeout", type=positive_int, default=None,
                   help="seconds a whole notebook may run (default: 6 x --timeout)")
    p.add_argument("--memory", type=positive_int, default=8192,
                   help="MB of address space each kernel process may use (default 8192)")
    p.add_argument("--max-output", type=positive_int, default=10,
                   help="MB a cell may print before it is interrupted (default 10)")
    p.add_argument("--out", default="gradebook",
                   help="folder for gradebook.csv and gradebook.json, written after every submission; "
                        "unchanged submissions already in it are not graded again (default: ./gradebook)")
    p.add_argument("--regrade", action="store_true", help="grade every submission again, ignoring --out's gradebook")
    p.add_argument("--jobs", type=jobs_count, default=None,
                   help="submissions graded at once, each kernel with its share of the cores as torch threads "
                        "(1 to the cores available; default: every core)")
    p.add_argument("--shard", type=shard_spec, default=None, metavar="INDEX/COUNT",
                   help="grade only shard INDEX (from 0) of COUNT, e.g. a job array's task: a fixed split of the "
                        "submissions; merge the shards' --out folders with `gradebook merge` (see docs/grading.md)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="run the kernels without their bubblewrap walls: only for submissions you trust (every "
                        "gradebook row records it; see docs/grading.md)")
    p.add_argument("--no-similarity", action="store_true",
                   help="do not write the similarity report (similarity.csv, .json, .md: pairs of submissions, and "
                        "submissions and the course's solutions, that share code; written beside the gradebook "
                        "unless --shard)")
    p.add_argument("--json", action="store_true")


def shard_spec(text: str):
    """argparse type: ``INDEX/COUNT``, a ``course.instructor.grading.shards.Shard``."""
    from course.instructor.grading.shards import Shard

    try:
        return Shard.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--shard ")) from None


def _grade(args: argparse.Namespace) -> dict:
    import sys
    from pathlib import Path

    from course.instructor import require

    require("grade", "nbformat", "nbclient", "jupyter_client", "ipykernel", *(() if args.no_similarity else
                                                                             ("copydetect",)))
    from course.instructor.grading.gradebook import Gradebook, format_gradebook, totals
    from course.instructor.grading.grade import grade, stop_on_signals
    from course.instructor.grading.isolation import walls
    from course.instructor.grading.key import read_key
    from course.instructor.grading.remote import check_socket_room
    from course.instructor.grading.sandbox import Limits
    from course.instructor.grading.shards import check_out_for
    from course.instructor.grading.submissions import find_submissions
    from course.threads import cpu_cores, share_of_cores

    shard = args.shard
    jobs = args.jobs or cpu_cores()
    read_key(Path(args.key))  # an unusable key is reported before anything is graded
    isolation = walls(not args.no_sandbox, Path(args.key), args.paths)  # so is a machine without walls for them
    check_socket_room()  # and a TMPDIR too long for the kernels' sockets
    find_submissions(args.paths, args.layout)  # a missing PATH is reported before --out is created
    check_out_for(Path(args.out), shard)
    book = Gradebook(Path(args.out), regrade=args.regrade)  # checked before anything is graded
    total = args.total_timeout or 6 * args.timeout
    limits = Limits(cpu_seconds=2 * total, memory_mb=args.memory, output_mb=args.max_output)

    try:
        with stop_on_signals() as stopping:
            rows = grade(args.paths, args.timeout, args.total_timeout, args.layout, limits, book,
                         progress=None if args.json else lambda line: print(line, flush=True), stop=stopping,
                         jobs=jobs, threads=share_of_cores(jobs), shard=shard, key=Path(args.key),
                         sandbox=isolation if isolation is not None else False,
                         similarity=not args.no_similarity)
    except KeyboardInterrupt:
        print(f"interrupted: {book.json_path} and {book.csv_path} hold the submissions graded so far; "
              "run the same command again to grade the rest", file=sys.stderr)
        raise SystemExit(130) from None
    if not args.json:
        print(format_gradebook(rows))
        print(f"wrote {book.csv_path} and {book.json_path}" + (f" (shard {shard})" if shard else ""))
    similarity = None if args.no_similarity or shard else _similarity_summary(book.folder, args.json)
    return {"rows": rows, "totals": totals(rows), "gradebook": [str(book.csv_path), str(book.json_path)],
            "jobs": jobs, "shard": str(shard) if shard else None, "similarity": similarity}


def _similarity_summary(folder, quiet: bool) -> dict:
    """What the similarity report in ``folder`` holds: its files and the flagged pairs (printed unless
    ``quiet``)."""
    import json

    from course.instructor.grading.similarity import FILES

    report = json.loads((folder / FILES[1]).read_text(encoding="utf-8"))
    flagged = [p for p in report["pairs"] if p["flagged"]]
    if not quiet:
        for p in flagged:
            print(f"similar: notebook {p['notebook']}, {p['student_a']} and {p['student_b']}: score {p['score']:.2f}")
        print(f"wrote the similarity report {folder / FILES[2]} ({len(flagged)} flagged pair(s) to review; no grade "
              "changed)")
    return {"files": [str(folder / f) for f in FILES], "flagged": flagged}


def _gradebook_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    merge = sub.add_parser("merge", help="merge the gradebooks of every shard (grade --shard i/N) into one",
                           description="merge the gradebooks of every shard (grade --shard i/N) into one; refuses "
                                       "missing, unfinished or overlapping shards")
    merge.add_argument("shards", nargs="+", metavar="SHARD_DIR", help="the --out folder of every shard")
    merge.add_argument("--out", required=True, help="folder for the merged gradebook.csv and gradebook.json")
    merge.add_argument("--key", default=None, metavar="FILE",
                       help="the grading key the shards were graded with: also write the class's similarity report "
                            "(read from the submissions the gradebook names)")
    merge.add_argument("--json", action="store_true")


def _gradebook(args: argparse.Namespace) -> dict:
    from course.instructor.grading.gradebook import totals
    from course.instructor.grading.shards import merge

    key = None
    if args.key:
        from pathlib import Path

        from course.instructor import require
        from course.instructor.grading.key import read_key

        require("gradebook merge --key", "copydetect")
        key = read_key(Path(args.key))  # an unusable key is reported before anything is written
    book = merge(args.shards, args.out)
    if not args.json:
        people = len(totals(book.rows))
        print(f"merged {len(args.shards)} shards: {len(book.rows)} rows for {people} student(s) in "
              f"{book.csv_path} and {book.json_path}")
    similarity = None
    if key is not None:
        from course.instructor.grading.similarity import entries_from_rows, write_similarity

        write_similarity(book.folder, entries_from_rows(book.rows), key)
        similarity = _similarity_summary(book.folder, args.json)
    return {"rows": book.rows, "totals": totals(book.rows), "gradebook": [str(book.csv_path), str(book.json_path)],
            "similarity": similarity}


# ----------------------------------------------------------------------------- check-outputs
def _check_outputs_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", default=["outputs"],
                   help="executed notebooks, or folders of them (default: ./outputs)")
    p.add_argument("--json", action="store_true")


def _check_outputs(args: argparse.Namespace) -> dict:
    from course.instructor import require

    require("check-outputs", "nbformat")
    from course.instructor.output_check import check_paths

    notebooks, problems = check_paths(args.paths)
    if problems:
        listing = "\n".join(f"  {p}" for p in problems)
        raise RuntimeError(f"{len(problems)} output(s) that read badly without a kernel:\n{listing}")
    if not args.json:
        print(f"{len(notebooks)} executed notebook(s): no frozen progress bar, widget text or loading message")
    return {"notebooks": [str(n) for n in notebooks], "problems": []}


# ----------------------------------------------------------------------------- site
def _site_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="source", default="outputs",
                   help="folder of executed notebooks (default: ./outputs, written by run-course.sh --execute)")
    p.add_argument("--out", default="site", help="folder for the pages (default: ./site)")
    p.add_argument("--root", default=".", help="the repository's folder: README.md, docs/ (default: .)")
    p.add_argument("--partial", action="store_true", help="build even when some notebooks were not executed")
    p.add_argument("--json", action="store_true")


def _site(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from course.instructor import require

    require("site", "nbformat", "nbconvert")
    from course.instructor.site import build_site

    if not (Path(args.root) / "README.md").is_file():
        raise ValueError(f"--root {args.root!r} is not the course's repository (no README.md)")
    check_out_folder(args.out)
    result = build_site(args.source, args.out, args.root, partial=args.partial)
    if not args.json:
        left = f"; not executed, so not in it: {', '.join(result['missing'])}" if result["missing"] else ""
        print(f"{len(result['pages'])} pages in {result['out']}/ (open {result['out']}/index.html){left}")
    return result


# ----------------------------------------------------------------------------- notebooks
def _notebooks_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def _notebooks(args: argparse.Namespace) -> dict:
    """The syllabus: every notebook with its points, its FAST budget and what it teaches."""
    from course import syllabus
    from course.instructor.grading.points import points_by_notebook

    points = points_by_notebook()
    rows = [{"notebook": nb.name, "points": sum(points[nb.number].values()), "fast_budget_s": nb.fast_budget_s,
             "exercises": nb.exercises, "teaches": nb.teaches} for nb in syllabus.notebooks()]
    if not args.json:
        for row in rows:
            print(f"{row['notebook']:<28} {row['points']:>4} points  FAST <= {row['fast_budget_s'] // 60} min  "
                  f"{row['teaches']}")
    return {"notebooks": rows}


# ----------------------------------------------------------------------------- architecture
def _architecture_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--page", default="docs/architecture.md", help="the page to draw in (default: docs/architecture.md)")
    p.add_argument("--check", action="store_true", help="write nothing; exit with an error if the drawing is stale")
    p.add_argument("--json", action="store_true")


def _architecture(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from course.instructor.architecture import write_page

    current = write_page(Path(args.page), check=args.check)
    if args.check and not current:
        raise RuntimeError(f"{args.page} does not draw the imports of course/ as they are now "
                           "(run `python -m course architecture`)")
    if not args.json:
        print(f"{args.page}: {'up to date' if current else 'drawn again'}")
    return {"page": args.page, "up_to_date": current}


COMMANDS = [
    Command("host", "where the course lives: the Colab cells and README links follow pyproject.toml", _host_args,
            _host),
    Command("release", "write the student copies of the notebooks (exercise solutions removed)", _release_args,
            _release),
    Command("grade", "autograde submitted notebooks into a gradebook (CSV and JSON)", _grade_args, _grade),
    Command("gradebook", "gradebooks: merge the shards of a grading split over several machines", _gradebook_args,
            _gradebook),
    Command("check-outputs", "check executed notebooks for frozen progress bars, widget text, loading messages",
            _check_outputs_args, _check_outputs),
    Command("site", "build the course site (HTML pages of the executed notebooks, index, benchmarks)", _site_args,
            _site),
    Command("notebooks", "list the course's notebooks: points, FAST time budget, what each teaches",
            _notebooks_args, _notebooks),
    Command("architecture", "draw the layers of course/ from its imports into docs/architecture.md",
            _architecture_args, _architecture),
]
