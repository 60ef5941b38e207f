"""The subcommands of ``python -m course``. Each returns a dict (printed as JSON with --json)."""

from __future__ import annotations

import argparse
import json
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["COMMANDS", "Command"]


@dataclass
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], dict | None]

    def add_parser(self, sub) -> None:
        p = sub.add_parser(self.name, help=self.help, description=self.help)
        self.configure(p)
        p.set_defaults(run=self.run)


SEED_MAX = 2**32 - 1  # seeds: what every generator (torch, numpy, random) accepts


def _int(text: str, low: int, high: int | None = None) -> int:
    allowed = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}") from None
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {text}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int(text, 0)


def seed_int(text: str) -> int:
    """argparse type: a seed, 0 .. 2**32 - 1."""
    return _int(text, 0, SEED_MAX)


def unit_float(text: str) -> float:
    """argparse type: a number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {text!r}")
    return value


def device_name(text: str) -> str:
    """argparse type: auto, cpu, cuda, cuda:N or mps (whether it exists is checked when it is used)."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", text):
        raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda, cuda:N or mps, got {text!r}")
    return text


def check_out_folder(path: str, label: str = "--out") -> None:
    """Before long work: the output folder can be created and written (else a one-line ``ValueError``)."""
    from pathlib import Path

    from course.assets import probe_write

    if not path.strip():
        raise ValueError(f"{label} must name a folder, got {path!r}")
    try:
        probe_write(Path(path))
    except OSError as e:
        raise ValueError(f"{label} {path!r} is not a writable folder ({e.strerror or e})") from None


# ----------------------------------------------------------------------------- fetch
def _fetch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", default=["smollm2-135m", "austen"],
                   help="assets: smollm2-135m, austen (default: both)")
    p.add_argument("--force", action="store_true", help="derive again even if present and intact")
    p.add_argument("--json", action="store_true")


def _fetch(args: argparse.Namespace) -> dict:
    """Fetch, verify every checksum, repair what is damaged."""
    from course import assets

    folders = assets.fetch(tuple(args.names), progress=not args.json, force=args.force)
    if not args.json:
        for name, folder in folders.items():
            print(f"{name}: ready in {folder}")
    return {name: str(folder) for name, folder in folders.items()}


# ----------------------------------------------------------------------------- info
def _info_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verify", action="store_true",
                   help="check the SHA-256 of every cached file (exit status 2 if one is damaged)")
    p.add_argument("--json", action="store_true")


def _info(args: argparse.Namespace) -> dict:
    import torch
    import transformers

    from course import __version__, assets
    from course.models import gpt2_available

    problems = assets.verify(full=args.verify)
    status = {name: not found for name, found in problems.items()}
    gpt2_ok, gpt2_why = gpt2_available()
    info = {
        "course": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu_threads": torch.get_num_threads(),
        "cache_dir": str(assets.cache_dir()),
        "models": {"smollm2-135m": status["smollm2-135m"], "gpt2": gpt2_ok},
        "corpora": {"austen": status["austen"]},
        "problems": {name: [str(p) for p in found] for name, found in problems.items()},
        "verified": "sha256" if args.verify else "size and mtime",
    }
    if not args.json:
        print(f"attention-sinks-course {info['course']}  python {info['python']}  torch {info['torch']}  "
              f"transformers {info['transformers']}")
        print(f"device: {info['device']}" + (f" ({info['gpu']})" if info["gpu"] else f" ({info['cpu_threads']} threads)"))
        print(f"cache:  {info['cache_dir']}")
        yes = {True: "available", False: "missing"}

        def state(name: str) -> str:
            if not problems[name]:
                return "available" + (" (every SHA-256 checked)" if args.verify else "")
            return "missing" if not assets.folder_of(name).exists() else f"DAMAGED: {problems[name][0]}"

        print(f"model smollm2-135m: {state('smollm2-135m')}")
        print(f"model gpt2:         {yes[gpt2_ok]} ({gpt2_why})")
        print(f"corpus austen:      {state('austen')}")
        if not all(status.values()):
            print("Run `python -m course fetch` to bring the missing assets and repair damaged ones.")
    if args.verify and not all(status.values()):
        if args.json:
            print(json.dumps(info, indent=1, default=str))
        name = next(n for n, ok in status.items() if not ok)
        raise assets.AssetDamaged(f"{name}: {problems[name][0]}; run `python -m course fetch {name}` to repair it")
    return info


# ----------------------------------------------------------------------------- stream
def _stream_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", choices=["auto", "gpt2", "smollm2-135m"])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--corpus", default="austen", help="austen (default), pg19 or wikitext")
    src.add_argument("--text-file", help="a local UTF-8 text file (only its first --tokens tokens are read)")
    p.add_argument("--book", default=None, help="with --corpus austen: one novel, e.g. pride_and_prejudice")
    p.add_argument("--policy", default="streaming", choices=["full", "window", "streaming"])
    p.add_argument("--sinks", type=non_negative_int, default=4, help="sink tokens (streaming), default 4")
    p.add_argument("--window", type=positive_int, default=1020, help="recent tokens kept, default 1020")
    p.add_argument("--positions", choices=["original", "cache"], default=None,
                   help="position rule (default: cache for streaming on RoPE models, else original)")
    p.add_argument("--tokens", type=positive_int, default=2048)
    p.add_argument("--method", choices=["auto", "exact", "decode"], default="auto",
                   help="exact chunked evaluator (default) or the token-by-token decode loop")
    p.add_argument("--device", default="auto", type=device_name)
    p.add_argument("--json", action="store_true")


def _check_text_source(args: argparse.Namespace) -> None:
    """Check --text-file / --corpus / --book before the model loads (cheap)."""
    from course.assets import AUSTEN_BOOKS, require
    from course.data import CORPORA, check_text_file

    if args.text_file is not None:
        check_text_file(args.text_file, "--text-file")
        if args.book is not None:
            raise ValueError("--book goes with --corpus austen, not with --text-file")
        return
    if args.corpus not in CORPORA:
        raise ValueError(f"--corpus must be one of {', '.join(CORPORA)} (or use --text-file PATH), got {args.corpus!r}")
    if args.corpus == "austen":
        if args.book is not None and args.book not in AUSTEN_BOOKS.values():
            raise ValueError(f"--book must be one of {', '.join(AUSTEN_BOOKS.values())}; got {args.book!r}")
        require("austen")


def _stream_ids(args: argparse.Namespace, tok, device):
    """The first --tokens token ids of the chosen text; a text file is read only as far as needed."""
    from course.data import load_text, tokenize, tokenize_file

    if args.text_file is not None:
        return tokenize_file(tok, args.text_file, args.tokens, device, label="--text-file")
    return tokenize(tok, load_text(args.corpus, args.book), args.tokens, device)


def _stream(args: argparse.Namespace) -> dict:
    from course.models import load_model
    from course.policies import FullCache, SlidingWindow, StreamingLLM
    from course.streaming import evaluate_stream

    _check_text_source(args)
    model, tok = load_model(args.model, args.device, verbose=not args.json)
    family = model.config.family
    rule = args.positions or ("cache" if args.policy == "streaming" and family == "llama" else "original")
    if args.policy == "full":
        policy = FullCache()
    elif args.policy == "window":
        policy = SlidingWindow(args.window, rule)
    else:
        policy = StreamingLLM(args.sinks, args.window, rule)
    ids = _stream_ids(args, tok, model.device)
    result = evaluate_stream(model, ids, policy, args.method, progress=not args.json)
    out = {
        "model": model.config.name, "policy": args.policy, "label": policy.label, "positions": policy.position_rule,
        "sinks": args.sinks if args.policy == "streaming" else 0,
        "window": None if args.policy == "full" else args.window, "tokens": result.tokens,
        "ppl": result.ppl(), "ppl_after_fill": result.ppl_after_fill, "max_cache_bytes": result.max_cache_bytes,
        "seconds": round(result.seconds, 3), "method": args.method, "device": str(model.device),
    }
    if not args.json:
        after = "n/a (the cache never filled)" if out["ppl_after_fill"] is None else f"{out['ppl_after_fill']:.2f}"
        print(f"{out['model']} {policy.label} [{policy.position_rule} positions] on {out['tokens']} tokens: "
              f"PPL {out['ppl']:.2f}, after the cache fills {after}, max cache "
              f"{out['max_cache_bytes'] / 2**20:.1f} MiB, {out['seconds']:.1f} s")
    return out


# ----------------------------------------------------------------------------- needle
def _needle_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", choices=["auto", "gpt2", "smollm2-135m"])
    p.add_argument("--policy", default="snapkv", choices=["full", "window", "streaming", "h2o", "snapkv", "random"])
    p.add_argument("--budget", type=positive_int, nargs="+", default=[128], help="cache slots per KV head (several: a sweep)")
    p.add_argument("--sinks", type=non_negative_int, default=0, help="pin the first tokens (streaming: 4 if 0)")
    p.add_argument("--depth", type=unit_float, default=0.3, help="where the needle sits, 0 (start) .. 1 (end)")
    p.add_argument("--context", type=positive_int, default=500, help="filler tokens around the needle")
    p.add_argument("--trials", type=positive_int, default=8)
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--device", default="auto", type=device_name)
    p.add_argument("--json", action="store_true")


def _needle(args: argparse.Namespace) -> dict | list:
    from course.evaluate import budget_sweep, make_needle_trials
    from course.models import load_model

    if not 0.0 <= args.depth <= 1.0:
        raise ValueError(f"--depth must be between 0 and 1, got {args.depth}")
    model, tok = load_model(args.model, args.device, verbose=not args.json)
    trials = make_needle_trials(tok, args.trials, args.context, args.depth, args.seed)
    rows = budget_sweep(model, trials, args.policy, args.budget, args.sinks, progress=not args.json)
    for r in rows:
        r.update(model=model.config.name, depth=args.depth, trials=args.trials, prompt_tokens=int(trials[0].prompt.shape[1]))
        if not args.json:
            print(f"{r['model']} {args.policy} budget {r['budget']} (prompt ~{r['prompt_tokens']} tokens, needle at "
                  f"depth {args.depth}): accuracy {r['accuracy']:.2f}, mean answer log-prob "
                  f"{r['mean_answer_logprob']:.2f}, needle tokens kept {r['needle_kept']:.2f}")
    return rows[0] if len(rows) == 1 else rows


# ----------------------------------------------------------------------------- train
def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variant", default="sink-token", choices=["vanilla", "sink-token", "sink-logit", "off-by-one"])
    p.add_argument("--task", default="bigram-backcopy", choices=["bigram-backcopy", "text"])
    p.add_argument("--preset", default="fast", choices=["fast", "full"])
    p.add_argument("--steps", type=positive_int, default=None, help="override the preset's number of steps")
    p.add_argument("--seed", type=seed_int, default=0, help=f"0 .. {SEED_MAX}")
    p.add_argument("--windows", type=positive_int, nargs="+", default=[2, 8, 16], help="recent windows to evaluate")
    p.add_argument("--device", default="auto", type=device_name)
    p.add_argument("--retrain", action="store_true", help="train even if this run is stored in the cache")
    p.add_argument("--json", action="store_true")


def _train(args: argparse.Namespace) -> dict:
    import torch

    from course.models import resolve_device
    from course.train import make_task, sink_mass_of, train, variant_config, window_losses

    overrides = {"task": args.task, "seed": args.seed}
    if args.steps is not None:
        overrides["steps"] = args.steps
    cfg = variant_config(args.variant, args.preset, **overrides)
    dev = resolve_device(args.device)
    run = train(cfg, dev, progress=not args.json, retrain=args.retrain)
    held_out = make_task(cfg.task).sample(64, cfg.seq_len, torch.Generator().manual_seed(99_999)).to(dev)
    losses = window_losses(run, held_out, args.windows, [0, 1, 2, 4])
    out = {
        "variant": cfg.variant, "task": cfg.task, "preset": args.preset, "seed": cfg.seed, "steps": cfg.steps,
        "seconds": round(run.seconds, 1), "loaded_from_cache": run.loaded, "final_loss": run.log[-1]["loss"],
        "sink_mass": sink_mass_of(run, held_out), "full_loss": losses["full"],
        "window_loss": {f"W={w}": {str(k): v for k, v in row.items()} for w, row in losses["windows"].items()},
        "run_dir": str(run.path),
    }
    if not args.json:
        where = "the sink logit" if cfg.variant in ("sink-logit", "off-by-one") else "position 0"
        print(f"{cfg.variant} on {cfg.task}: {cfg.steps} steps in {out['seconds']} s"
              f"{' (loaded from the cache)' if run.loaded else ''}; final training loss {out['final_loss']:.3f}")
        print(f"attention on {where}: {out['sink_mass']:.3f};  held-out loss, full attention: {losses['full']:.4f}")
        for w, row in losses["windows"].items():
            print(f"  window {w:3d}: " + "  ".join(f"{k} kept: {v:.4f}" for k, v in row.items()))
    return out


# ----------------------------------------------------------------------------- bench
def _bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", choices=["gpt2", "smollm2-135m"])
    p.add_argument("--device", default="auto", type=device_name, help="cpu, cuda or auto")
    p.add_argument("--quick", action="store_true", help="smaller sizes (a few minutes on a laptop CPU)")
    p.add_argument("--out", default="bench-results", help="folder for the tables and plots (without --json)")
    p.add_argument("--json", action="store_true", help="print one JSON object with every ratio instead")


def _bench(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from course.bench import markdown_tables, run_bench, save_report

    if not args.json:
        check_out_folder(args.out)
    result = run_bench(args.model, args.device, args.quick, progress=not args.json)
    if not args.json:
        paths = save_report(result, Path(args.out))
        print(markdown_tables(result))
        print("Saved: " + ", ".join(str(p) for p in paths))
    return result


# ----------------------------------------------------------------------------- release
def _release_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--notebooks", default="notebooks", help="folder of the solution notebooks (default: ./notebooks)")
    p.add_argument("--out", default=None, help="folder for the student copies (default: <notebooks>/student)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit with an error listing the student copies that are not up to date")
    p.add_argument("--json", action="store_true")


def _release(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from course.grading.release import check_release, release

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
    written = release(solutions, students)
    if not args.json:
        for path in written:
            print(f"wrote {path}")
    return {"student_dir": str(students), "written": [str(p) for p in written]}


# ----------------------------------------------------------------------------- grade
def _grade_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="submitted notebooks, or folders searched recursively for *.ipynb; the student is the "
                        "file name's prefix before '__' (alice__01_kv_cache.ipynb), else the folder's name")
    p.add_argument("--timeout", type=positive_int, default=300, help="seconds each cell may run (default 300)")
    p.add_argument("--total-timeout", type=positive_int, default=None,
                   help="seconds a whole notebook may run (default: 6 x --timeout)")
    p.add_argument("--out", default="gradebook",
                   help="folder for gradebook.csv and gradebook.json (default: ./gradebook)")
    p.add_argument("--json", action="store_true")


def _grade(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from course.grading.grade import format_gradebook, grade, totals, write_gradebook

    check_out_folder(args.out)
    rows = grade(args.paths, args.timeout, args.total_timeout, progress=not args.json)
    csv_path, json_path = write_gradebook(rows, Path(args.out))
    if not args.json:
        print(format_gradebook(rows))
        print(f"wrote {csv_path} and {json_path}")
    return {"rows": rows, "totals": totals(rows), "gradebook": [str(csv_path), str(json_path)]}


COMMANDS: list[Command] = [
    Command("fetch", "download the offline model and corpus into the course cache", _fetch_args, _fetch),
    Command("info", "show device, versions, and which models and corpora are available", _info_args, _info),
    Command("stream", "perplexity of a long text streamed through a bounded KV cache", _stream_args, _stream),
    Command("needle", "passkey retrieval after compressing the prompt's cache to a budget", _needle_args, _needle),
    Command("train", "pretrain a tiny model with or without a sink token / sink logit", _train_args, _train),
    Command("bench", "speed and memory: ratios measured side by side in one run", _bench_args, _bench),
    Command("release", "write the student copies of the notebooks (exercise solutions removed)", _release_args,
            _release),
    Command("grade", "autograde submitted notebooks into a gradebook (CSV and JSON)", _grade_args, _grade),
]
