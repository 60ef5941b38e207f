"""``bench``: speed and memory of the policies, and, instead, the notebooks' wall times, threads, grading
throughput, the similarity report's time, transformers' cache or the quantized store's peer."""

from __future__ import annotations

import argparse

from course.cli.args import Command, _model_args, check_out_folder, jobs_count, positive_int


# ----------------------------------------------------------------------------- bench
def _bench_args(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group()
    what.add_argument("--notebooks", action="store_true",
                      help="instead: execute every notebook (papermill) and write a table of wall times")
    what.add_argument("--threads", action="store_true",
                      help="instead: time matmuls of the course's shapes with 1 thread and with every core")
    what.add_argument("--grading", action="store_true",
                      help="instead: grade --copies submissions once per --jobs value; submissions per minute, "
                           "CPU time per submission and a class's projection -> docs/grading.md")
    what.add_argument("--similarity", action="store_true",
                      help="instead: time the similarity report for --students synthetic submissions of notebook 01 "
                           "and of every notebook (no kernel, no grading)")
    what.add_argument("--transformers-cache", action="store_true",
                      help="instead: per-token decode of transformers with the course's StreamingLLM cache vs its "
                           "plain DynamicCache, and the course's decode vs transformers' -> docs/benchmarks.md")
    what.add_argument("--quantized-peer", action="store_true",
                      help="instead: perplexity of the course's quantized store (KIVI) beside transformers' "
                           "QuantizedCache (quanto backend) on the same weights and passages -> docs/benchmarks.md")
    _model_args(p)
    p.add_argument("--quick", action="store_true", help="smaller sizes (a few minutes on a laptop CPU)")
    p.add_argument("--fast", action="store_true", help="with --notebooks: run them in FAST mode")
    p.add_argument("--profile", action="store_true",
                   help="with --transformers-cache: print a profile of one decode step of each decoder instead")
    p.add_argument("--competing", action="store_true",
                   help="with --notebooks or --threads: measure again next to one CPU-bound process")
    p.add_argument("--notebook-dir", default="notebooks", help="with --notebooks: folder of the notebooks to run")
    p.add_argument("--only", nargs="+", default=None, metavar="NN",
                   help="with --notebooks: run only the notebooks with these numbers (e.g. --only 01 05); the "
                        "table keeps the others' earlier times")
    p.add_argument("--students", type=positive_int, default=500,
                   help="with --similarity: synthetic submissions per notebook (default 500)")
    p.add_argument("--copies", type=positive_int, default=8, help="with --grading: submissions per run (default 8)")
    p.add_argument("--jobs", type=jobs_count, nargs="+", default=None,
                   help="with --grading: the --jobs values to measure (default: 1 and every core)")
    p.add_argument("--submission", nargs="+", default=None,
                   help="with --grading: notebooks the submissions are copies of, in turn (default: notebook "
                        "01's solution and its student copy)")
    p.add_argument("--report", default=None,
                   help="with --notebooks, --threads or --grading: the markdown file for the table "
                        "(default docs/notebook-times.md, docs/threads.md or docs/grading.md)")
    p.add_argument("--out", default="bench-results",
                   help="folder for the tables and plots (without --json); with --notebooks, the executed copies")
    p.add_argument("--json", action="store_true", help="print one JSON object with every ratio instead")


def _check_bench_flags(args: argparse.Namespace) -> None:
    """Flags that belong to another kind of benchmark: refused by name."""
    if args.fast and not args.notebooks:
        raise ValueError("--fast applies to --notebooks only")
    if args.profile and not args.transformers_cache:
        raise ValueError("--profile applies to --transformers-cache only")
    if args.only is not None and not args.notebooks:
        raise ValueError("--only applies to --notebooks only")
    if args.competing and not (args.notebooks or args.threads):
        raise ValueError("--competing applies to --notebooks or --threads only")
    if args.report is not None and not (args.notebooks or args.threads or args.grading or args.transformers_cache
                                        or args.quantized_peer):
        raise ValueError("--report applies to --notebooks, --threads, --grading, --transformers-cache or "
                         "--quantized-peer only")
    for flag, value in (("--jobs", args.jobs), ("--submission", args.submission)):
        if value is not None and not args.grading:
            raise ValueError(f"{flag} applies to --grading only")
    if args.students != 500 and not args.similarity:
        raise ValueError("--students applies to --similarity only")


def _bench_notebooks(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from course.instructor import require

    require("bench --notebooks", "nbformat", "papermill", "ipykernel")
    from course.instructor.notebook_times import (budget_verdict, check_mergeable, time_notebooks, times_table,
                                                  write_times)

    every = sorted(Path(args.notebook_dir).glob("[0-9]*.ipynb"))
    if not every:
        raise ValueError(f"--notebook-dir must hold numbered notebooks (01_*.ipynb ...); none in {args.notebook_dir}")
    numbers = {p.name[:2] for p in every}
    unknown = sorted(set(args.only or ()) - numbers)
    if unknown:
        raise ValueError(f"--only must name notebook numbers of {args.notebook_dir} ({', '.join(sorted(numbers))}); "
                         f"got {', '.join(unknown)}")
    paths = [p for p in every if args.only is None or p.name[:2] in args.only]
    report = Path(args.report or "docs/notebook-times.md")
    check_mergeable(report, args.fast, args.competing, {p.stem for p in paths})  # before hours of notebooks
    rows = time_notebooks(paths, Path(args.out) / "notebooks", args.fast, args.competing, verbose=not args.json)
    write_times(rows, report, args.fast, notebooks=[p.stem for p in every])
    readme = None
    if args.fast and report.resolve() == Path(args.notebook_dir).resolve().parent / "docs" / "notebook-times.md":
        from course.instructor.syllabus_files import write_readme_table

        readme = write_readme_table(Path(args.notebook_dir))  # the front page's FAST column follows the table
    if not args.json:
        print(times_table(rows))
        if args.fast:
            print(budget_verdict(rows))
        print(f"Saved: {report}" + (f" and the FAST column of {readme}" if readme else ""))
    return {"rows": rows, "report": str(report)}


def _bench_threads(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from course.threads import bench_threads, threads_report, threads_table

    result = bench_threads(args.competing)
    report = Path(args.report or "docs/threads.md")
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(threads_report(result))
    if not args.json:
        print(threads_table(result))
        print(f"Saved: {report}")
    return result | {"report": str(report)}


def _bench_grading(args: argparse.Namespace) -> dict:
    import os
    import shlex
    import tempfile
    from pathlib import Path

    from course.instructor import require

    require("bench --grading", "nbformat", "nbclient", "jupyter_client", "ipykernel")
    from course.instructor.grading.throughput import grading_report, measure_grading, project_class, write_report
    from course.instructor.notebook_times import read_times
    from course.instructor.release import release
    from course.threads import cpu_cores

    submissions = [Path(s) for s in args.submission or ["notebooks/01_kv_cache.ipynb",
                                                          "notebooks/student/01_kv_cache.ipynb"]]
    times = read_times(Path("docs/notebook-times.md"))  # read before the long run: the projection needs it
    jobs = args.jobs or sorted({1, cpu_cores()})
    with tempfile.TemporaryDirectory(prefix="course-bench-grading-") as work:
        key = Path(work) / "key.json"  # the submissions are this repository's notebooks: a key for their own questions
        release(Path("notebooks"), Path(work) / "released", hidden_answers=True, key_path=key, seed=0, variants=False)
        result = measure_grading(submissions, args.copies, jobs, Path(work), key, progress=not args.json)
    projection = project_class(result, times)
    setting = [f"{k}={os.environ[k]}" for k in ("COURSE_MODEL", "HF_HUB_OFFLINE") if os.environ.get(k)]
    command = shlex.join([*setting, "python", "-m", "course", "bench", "--grading", "--copies", str(args.copies),
                          "--jobs", *map(str, jobs)] + (["--submission", *args.submission] if args.submission else []))
    report = write_report(Path(args.report or "docs/grading.md"), grading_report(result, projection, command))
    if not args.json:
        print(grading_report(result, projection, command))
        print(f"Saved: {report}")
    return result | {"projection": projection, "report": str(report)}


def _bench_similarity(args: argparse.Namespace) -> dict:
    import shlex

    from course.instructor import require

    require("bench --similarity", "nbformat", "copydetect")
    from course.instructor.grading.similarity_bench import bench_similarity, similarity_table

    result = bench_similarity(args.students)
    command = shlex.join(["python", "-m", "course", "bench", "--similarity"]
                         + ([] if args.students == 500 else ["--students", str(args.students)]))
    if not args.json:
        print(similarity_table(result, command))
    return result | {"command": command}


def _bench_transformers_cache(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from course.instructor.transformers_bench import (bench_transformers_cache, profile_decode,
                                                      transformers_cache_table, write_transformers_cache_report)
    from course.models import resolve_device

    name = _bench_model(args)
    device = str(resolve_device(args.device))
    if args.profile:
        print(profile_decode(name, device, context=256 if args.quick else 1024))
        return {}
    sizes = dict(policy_contexts=(256, 1024), course_contexts=(256,), steps=2) if args.quick else {}
    result = bench_transformers_cache(name, device, progress=not args.json, **sizes)
    command = _bench_command("--transformers-cache", args, device)
    report = write_transformers_cache_report(result, Path(args.report or "docs/benchmarks.md"), command)
    return _show(args, result, transformers_cache_table(result, command), report)


def _bench_quantized_peer(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from course.instructor import require

    require("bench --quantized-peer", "optimum.quanto")
    from course.instructor.quantized_peer import quantized_peer, quantized_peer_table, write_quantized_peer_report
    from course.models import resolve_device

    result = quantized_peer(_bench_model(args), str(resolve_device(args.device)),
                            **(dict(tokens=160) if args.quick else {}))
    command = _bench_command("--quantized-peer", args)
    report = write_quantized_peer_report(result, Path(args.report or "docs/benchmarks.md"), command)
    return _show(args, result, quantized_peer_table(result, command), report)


def _bench_model(args: argparse.Namespace) -> str:
    """The model a transformers benchmark runs: SmolLM2-135M unless one is named."""
    return "smollm2-135m" if args.model == "auto" else args.model


def _bench_command(flag: str, args: argparse.Namespace, device: str = "cpu") -> str:
    """The command line that repeats a transformers benchmark, as its report quotes it."""
    import shlex

    return shlex.join(["python", "-m", "course", "bench", flag] + (["--quick"] if args.quick else [])
                      + ([] if args.model in ("auto", "smollm2-135m") else ["--model", args.model])
                      + ([] if device == "cpu" else ["--device", device]))


def _show(args: argparse.Namespace, result: dict, table: str, report) -> dict:
    """Print a benchmark's table and where it was saved (unless --json); the result with the report's path."""
    if not args.json:
        print(table)
        print(f"Saved: {report}")
    return result | {"report": str(report)}


def _bench(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from course.instructor.bench import markdown_tables, run_bench, save_report

    _check_bench_flags(args)
    if args.notebooks:
        return _bench_notebooks(args)
    if args.threads:
        return _bench_threads(args)
    if args.grading:
        return _bench_grading(args)
    if args.similarity:
        return _bench_similarity(args)
    if args.transformers_cache:
        return _bench_transformers_cache(args)
    if args.quantized_peer:
        return _bench_quantized_peer(args)
    if not args.json:
        check_out_folder(args.out)
    result = run_bench(args.model, args.device, args.quick, progress=not args.json)
    if not args.json:
        paths = save_report(result, Path(args.out))
        print(markdown_tables(result))
        print("Saved: " + ", ".join(str(p) for p in paths))
    return result


COMMANDS = [
    Command("bench", "speed and memory: ratios measured side by side in one run", _bench_args, _bench),
]
