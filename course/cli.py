"""The subcommands of ``python -m course``. Each returns a dict (printed as JSON with --json)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass

from course.model_names import DEVICE_PATTERN, SEED_MAX

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




def _int(text: str, low: int, high: int | None = None) -> int:
    allowed = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}") from None
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {text}")
    return value


def model_name(text: str) -> str:
    """A course model name, or a Hugging Face checkpoint: ``org/name`` on the hub or a local folder."""
    from course.model_names import check_model_name

    try:
        return check_model_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", type=model_name,
                   help="auto, gpt2, smollm2-135m (default), gpt2-random, or a Hugging Face checkpoint")
    p.add_argument("--device", default="auto", type=device_name, help="cpu, cuda, cuda:N, mps or auto")


def _policy_args(p: argparse.ArgumentParser, policies: list[str], default: str, budget: int | list[int]) -> None:
    """The one vocabulary for a cache policy: --policy, --budget (slots per KV head, sinks included), --sinks."""
    p.add_argument("--policy", default=default, choices=policies)
    many = isinstance(budget, list)
    p.add_argument("--budget", type=positive_int, default=budget, nargs="+" if many else None,
                   help="cache slots per KV head, pinned sinks included" + (" (several: a sweep)" if many else "")
                        + f" (default {budget}; ignored by full)")
    p.add_argument("--sinks", type=non_negative_int, default=None,
                   help="first tokens pinned in the cache (default: 4 for streaming, else 0)")
    p.add_argument("--positions", choices=["original", "cache"], default=None,
                   help="position rule (default: what the model allows; cache for streaming on RoPE models)")


def _policy_for(args: argparse.Namespace, budget: int, model=None):
    """The policy the arguments ask for (``make_policy``); call it without a model to refuse bad values
    before the model loads, then with the model for its position rule."""
    from course.policies import make_policy

    return make_policy(args.policy, None if args.policy == "full" else budget, sinks=args.sinks,
                       positions=args.positions, model=model)


def device_name(text: str) -> str:
    """argparse type: auto, cpu, cuda, cuda:N or mps (whether it exists is checked when it is used)."""
    if not re.fullmatch(DEVICE_PATTERN, text):
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
        "models": {"smollm2-135m": status["smollm2-135m"], "gpt2": gpt2_ok,
                   "gpt2-random": status["smollm2-135m"]},  # random weights, SmolLM2's tokenizer
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
        print(f"model gpt2-random:  {state('smollm2-135m')} (GPT-2's shapes, random weights, SmolLM2's tokenizer)")
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
    _model_args(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--corpus", default="austen", help="austen (default), pg19 or wikitext")
    src.add_argument("--text-file", help="a local UTF-8 text file (only its first --tokens tokens are read)")
    p.add_argument("--book", default=None, help="with --corpus austen: one novel, e.g. pride_and_prejudice")
    _policy_args(p, ["full", "window", "streaming", "h2o", "h2o-mean", "random"], "streaming", 1024)  # SnapKV: see `needle`
    p.add_argument("--tokens", type=positive_int, default=2048)
    p.add_argument("--passages", type=positive_int, default=None,
                   help="measure over N >= 2 passages of --tokens tokens from all six novels (openings, then "
                        "mid-text): the spread instead of one number")
    p.add_argument("--seed", type=seed_int, default=0, help="with --passages: which passages (default 0)")
    p.add_argument("--method", choices=["auto", "exact", "decode"], default="auto",
                   help="exact chunked evaluator (default) or the token-by-token decode loop")
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
    from course.streaming import evaluate_stream

    budget = None if args.policy == "full" else args.budget
    _policy_for(args, args.budget)  # bad values: refused before the model loads
    _check_text_source(args)
    model, tok = load_model(args.model, args.device, verbose=not args.json)
    policy = _policy_for(args, args.budget, model)
    model.config.check_tokens(args.tokens, "--tokens")
    if args.passages is not None:
        return _stream_passages(args, model, tok, policy)
    ids = _stream_ids(args, tok, model.device)
    result = evaluate_stream(model, ids, policy, args.method, progress=not args.json)
    out = {
        "model": model.config.name, "policy": args.policy, "label": policy.label, "positions": policy.position_rule,
        "budget": budget, "sinks": getattr(policy, "n_sink", 0), "tokens": result.tokens,
        "ppl": result.ppl(), "ppl_after_fill": result.ppl_after_fill, "max_cache_bytes": result.max_cache_bytes,
        "seconds": round(result.seconds, 3), "method": args.method, "device": str(model.device),
    }
    if not args.json:
        after = "n/a (the cache never filled)" if out["ppl_after_fill"] is None else f"{out['ppl_after_fill']:.2f}"
        print(f"{out['model']} {policy.label} [{policy.position_rule} positions] on {out['tokens']} tokens: "
              f"PPL {out['ppl']:.2f}, after the cache fills {after}, max cache "
              f"{out['max_cache_bytes'] / 2**20:.1f} MiB, {out['seconds']:.1f} s")
    return out


def _stream_passages(args: argparse.Namespace, model, tok, policy) -> dict:
    """``stream --passages N``: the same policy over N passages, reported as a spread."""
    from course.passages import sample_passages, spread, stream_passages

    if args.text_file or args.corpus != "austen" or args.book:
        raise ValueError("--passages draws from all six Austen novels: drop --text-file, --book and --corpus")
    if args.passages < 2:
        raise ValueError(f"--passages must be at least 2 (one passage is an anecdote), got {args.passages}")
    passages = sample_passages(tok, args.passages, args.tokens, seed=args.seed)
    start = policy.budget if policy.budget is not None and policy.budget < args.tokens - 1 else 0
    ppl = stream_passages(model, passages, {"policy": policy}, start=start, progress=not args.json)["policy"]
    s = spread(ppl)
    out = {"model": model.config.name, "policy": args.policy, "label": policy.label, "positions": policy.position_rule,
           "tokens": args.tokens, "scored_from": start, "seed": args.seed,
           "ppl": {"mean": s.mean, "median": s.median, "min": s.low, "max": s.high,
                   "ci95_median": list(s.ci) if s.ci else None},
           "passages": [{"book": p.book, "offset": p.offset, "ppl": v} for p, v in zip(passages, ppl)]}
    if not args.json:
        for p, v in zip(passages, ppl):
            print(f"  {p.label:48s} PPL {v:8.2f}")
        print(f"{model.config.name} {policy.label}, {args.tokens} tokens, predictions from {start} on: PPL {s}")
    return out


# ----------------------------------------------------------------------------- needle
def _needle_args(p: argparse.ArgumentParser) -> None:
    _model_args(p)
    _policy_args(p, ["full", "window", "streaming", "h2o", "h2o-mean", "snapkv", "random"], "snapkv", [128])
    p.add_argument("--depth", type=unit_float, default=0.3, help="where the needle sits, 0 (start) .. 1 (end)")
    p.add_argument("--context", type=positive_int, default=500, help="filler tokens around the needle")
    p.add_argument("--trials", type=positive_int, default=8)
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--json", action="store_true")


def _needle(args: argparse.Namespace) -> dict | list:
    from course.evaluate import budget_sweep, make_needle_trials
    from course.models import load_model

    if not 0.0 <= args.depth <= 1.0:
        raise ValueError(f"--depth must be between 0 and 1, got {args.depth}")
    for b in args.budget:  # bad values: refused before the model loads
        _policy_for(args, b)
    model, tok = load_model(args.model, args.device, verbose=not args.json)
    trials = make_needle_trials(tok, args.trials, args.context, args.depth, args.seed, model=model)
    rows = budget_sweep(model, trials, args.policy, args.budget, args.sinks, progress=not args.json,
                        positions=args.positions)
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
    p.add_argument("--all-variants", action="store_true",
                   help="train every variant (--variant is then ignored) and, unless --no-bos, the vanilla model "
                        "without BOS too (notebook 06 compares them)")
    p.add_argument("--task", default="bigram-backcopy", choices=["bigram-backcopy", "text"])
    p.add_argument("--preset", default="fast", choices=["fast", "full"])
    p.add_argument("--no-bos", dest="bos", action="store_false",
                   help="samples begin with content, not with the same start token (BOS) as in the presets")
    p.add_argument("--steps", type=positive_int, default=None, help="override the preset's number of steps")
    p.add_argument("--seed", type=seed_int, default=0, help=f"0 .. {SEED_MAX}")
    p.add_argument("--seeds", type=positive_int, default=None,
                   help="train N seeds, --seed .. --seed + N - 1 (at least 3: what notebook 06 reports over)")
    p.add_argument("--windows", type=positive_int, nargs="+", default=[2, 8, 16], help="recent windows to evaluate")
    p.add_argument("--device", default="auto", type=device_name)
    p.add_argument("--retrain", action="store_true", help="train even if this run is stored in the cache")
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="runs trained at once, each in its own process with cores / jobs threads (CPU only); a tiny "
                        "model uses two cores poorly: 2 jobs on 2 cores trained notebook 06's 15 models in 7 minutes instead of "
                        "9-10")
    p.add_argument("--json", action="store_true")


def _train(args: argparse.Namespace) -> dict:
    """One run: its numbers. Several (--all-variants, --seeds): {"runs": [the numbers of each]}."""
    from course.models import resolve_device
    from course.train import VARIANTS, seed_list

    seeds = [args.seed]
    if args.seeds is not None:
        try:
            seeds = seed_list(args.seed, args.seeds)
        except ValueError as e:
            raise ValueError(f"--seeds/--seed: {e}") from None
    variants = VARIANTS if args.all_variants else (args.variant,)
    requested = resolve_device("auto").type if args.device == "auto" else args.device  # checked before resolving
    if args.jobs > 1 and requested != "cpu":  # a named GPU on a machine without one gets this message, not CUDA's
        raise ValueError(f"--jobs {args.jobs}: several training processes run on the CPU only, not on {requested} "
                         "(--device cpu, or --jobs 1 on the GPU)")
    dev = resolve_device(args.device)
    todo = [(variant, seed, args.bos) for variant in variants for seed in seeds]
    if args.all_variants and args.bos:  # notebook 06 also compares the vanilla model trained without BOS
        todo += [("vanilla", seed, False) for seed in seeds]
    if args.jobs == 1 or len(todo) == 1:
        runs = [_train_one(args, variant, seed, dev, bos) for variant, seed, bos in todo]
    else:
        runs = _train_in_processes(args, todo, dev)
    return runs[0] if len(runs) == 1 else {"runs": runs}


def _train_in_processes(args: argparse.Namespace, todo: list[tuple[str, int, bool]], dev) -> list[dict]:
    """Train ``todo`` (variant, seed, bos) in ``args.jobs`` processes, each with cores / jobs threads; print each
    run's summary as it ends (in the order given). Returns the runs' numbers in the order of ``todo``."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    jobs = min(args.jobs, len(todo))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    quiet = argparse.Namespace(**{**vars(args), "json": True})  # a worker prints nothing: no interleaved bars
    if not args.json:
        print(f"training {len(todo)} runs, {jobs} at once ({threads} thread{'s' if threads > 1 else ''} each)")
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_set_threads, initargs=(threads,)) as pool:
        futures = [pool.submit(_train_one, quiet, variant, seed, dev, bos) for variant, seed, bos in todo]
        runs = []
        for i, future in enumerate(futures, 1):
            runs.append(future.result())
            if not args.json:
                print(f"[{i}/{len(todo)}] ", end="")
                _print_run(runs[-1])
    return runs


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _train_one(args: argparse.Namespace, variant: str, seed: int, dev, bos: bool) -> dict:
    import torch

    from course.train import (attention_on_first, make_task, sink_mass_of, train, uniform_first, variant_config,
                              window_losses)

    overrides = {"task": args.task, "seed": seed, "bos": bos}
    if args.steps is not None:
        overrides["steps"] = args.steps
    cfg = variant_config(variant, args.preset, **overrides)
    run = train(cfg, dev, progress=not args.json, retrain=args.retrain)
    held_out = make_task(cfg.task).sample(64, cfg.seq_len, torch.Generator().manual_seed(99_999)).to(dev)
    losses = window_losses(run, held_out, args.windows, [0, 1, 2, 4])
    out = {
        "variant": cfg.variant, "task": cfg.task, "bos": cfg.bos, "preset": args.preset, "seed": cfg.seed,
        "steps": cfg.steps,
        "seconds": round(run.seconds, 1), "loaded_from_cache": run.loaded, "final_loss": run.log[-1]["loss"],
        "sink_mass": sink_mass_of(run, held_out),
        "attention_on_first": float(attention_on_first(run, held_out).mean()),
        "uniform_first": uniform_first(run.inputs(held_out).shape[1]), "full_loss": losses["full"],
        "window_loss": {f"W={w}": {str(k): v for k, v in row.items()} for w, row in losses["windows"].items()},
        "run_dir": str(run.path),
    }
    if not args.json:
        _print_run(out)
    return out


def _print_run(out: dict) -> None:
    """The summary of one training run (``_train_one``'s numbers)."""
    print(f"{out['variant']} on {out['task']}{' (samples begin with BOS)' if out['bos'] else ''}, seed {out['seed']}: "
          f"{out['steps']} steps in {out['seconds']} s"
          f"{' (loaded from the cache)' if out['loaded_from_cache'] else ''}; final training loss {out['final_loss']:.3f}")
    if out["variant"] in ("sink-logit", "off-by-one"):
        print(f"attention on the sink logit: {out['sink_mass']:.3f}")
    print(f"attention on position 0: {out['attention_on_first']:.3f} (uniform {out['uniform_first']:.3f});  "
          f"held-out loss, full attention: {out['full_loss']:.4f}")
    for w, row in out["window_loss"].items():
        print(f"  window {w.removeprefix('W='):>3s}: " + "  ".join(f"{k} kept: {v:.4f}" for k, v in row.items()))


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
    what.add_argument("--transformers-cache", action="store_true",
                      help="instead: per-token decode of transformers with the course's StreamingLLM cache vs its "
                           "plain DynamicCache, and the course's decode vs transformers' -> docs/benchmarks.md")
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
    if args.report is not None and not (args.notebooks or args.threads or args.grading or args.transformers_cache):
        raise ValueError("--report applies to --notebooks, --threads, --grading or --transformers-cache only")
    for flag, value in (("--jobs", args.jobs), ("--submission", args.submission)):
        if value is not None and not args.grading:
            raise ValueError(f"{flag} applies to --grading only")


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
    if not args.json:
        print(times_table(rows))
        if args.fast:
            print(budget_verdict(rows))
        print(f"Saved: {report}")
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
        key = Path(work) / "key.json"  # the submissions are this repository's notebooks: its release's key
        release(Path("notebooks"), Path(work) / "released", hidden_answers=True, key_path=key, seed=0)
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


def _bench_transformers_cache(args: argparse.Namespace) -> dict:
    import shlex
    from pathlib import Path

    from course.instructor.transformers_bench import (bench_transformers_cache, profile_decode,
                                                      transformers_cache_table, write_transformers_cache_report)
    from course.models import resolve_device

    name = "smollm2-135m" if args.model == "auto" else args.model
    device = str(resolve_device(args.device))
    if args.profile:
        print(profile_decode(name, device, context=256 if args.quick else 1024))
        return {}
    sizes = dict(policy_contexts=(256, 1024), course_contexts=(256,), steps=2) if args.quick else {}
    result = bench_transformers_cache(name, device, progress=not args.json, **sizes)
    command = shlex.join(["python", "-m", "course", "bench", "--transformers-cache"] + (["--quick"] if args.quick else [])
                         + ([] if args.model in ("auto", "smollm2-135m") else ["--model", args.model])
                         + ([] if device == "cpu" else ["--device", device]))
    report = write_transformers_cache_report(result, Path(args.report or "docs/benchmarks.md"), command)
    if not args.json:
        print(transformers_cache_table(result, command))
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
    if args.transformers_cache:
        return _bench_transformers_cache(args)
    if not args.json:
        check_out_folder(args.out)
    result = run_bench(args.model, args.device, args.quick, progress=not args.json)
    if not args.json:
        paths = save_report(result, Path(args.out))
        print(markdown_tables(result))
        print("Saved: " + ", ".join(str(p) for p in paths))
    return result


# ----------------------------------------------------------------------------- generate and chat
GENERATION_POLICIES = ["full", "window", "streaming", "h2o", "h2o-mean", "snapkv", "random"]


def _sampling_args(p: argparse.ArgumentParser, max_new_tokens: int) -> None:
    p.add_argument("--max-new-tokens", type=positive_int, default=max_new_tokens)
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: sampling")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling cut-off in (0, 1] (default 1)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the sampler (default 0)")


def _sampler_check(args: argparse.Namespace) -> None:
    from course.generate import Sampler

    Sampler(args.temperature, args.top_p, args.seed)  # bad values: refused before the model loads


def _generate_args(p: argparse.ArgumentParser) -> None:
    _model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", help="a UTF-8 text file holding the prompt")
    _policy_args(p, GENERATION_POLICIES, "streaming", 256)
    _sampling_args(p, 128)
    p.add_argument("--ignore-eos", action="store_true", help="generate all --max-new-tokens (for measurements)")
    p.add_argument("--json", action="store_true")


def _generate(args: argparse.Namespace) -> dict:
    import time
    from pathlib import Path

    from course.generate import generate
    from course.models import load_model

    _policy_for(args, args.budget)
    _sampler_check(args)
    prompt = args.prompt if args.prompt is not None else Path(args.prompt_file).read_text(encoding="utf-8")
    if not prompt.strip():
        raise ValueError("the prompt is empty")
    model, tok = load_model(args.model, args.device, verbose=not args.json)
    policy = _policy_for(args, args.budget, model)
    start = time.perf_counter()
    steps = []
    for step in generate(model, tok, prompt, policy, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos):
        steps.append(step)
        if not args.json:
            print(step.text, end="", flush=True)
    seconds = time.perf_counter() - start
    out = {"model": model.config.name, "policy": policy.label, "text": "".join(s.text for s in steps),
           "new_tokens": len(steps), "max_cache_bytes": max((s.cache_bytes for s in steps), default=0),
           "max_cache_slots": max((s.cache_slots for s in steps), default=0), "seconds": round(seconds, 3),
           "seed": args.seed, "temperature": args.temperature, "top_p": args.top_p}
    if not args.json:
        print(f"\n[{out['new_tokens']} tokens in {seconds:.1f} s through {policy.label}; cache at most "
              f"{out['max_cache_slots']} slots, {out['max_cache_bytes'] / 2**20:.2f} MiB]")
    return out


def _chat_args(p: argparse.ArgumentParser) -> None:
    _model_args(p)
    _policy_args(p, GENERATION_POLICIES, "streaming", 256)
    _sampling_args(p, 96)
    p.add_argument("--system", default=None, help="a system message (default: the chat template's own)")
    p.add_argument("--script", help="a text file of user turns, one per line, fed without asking")
    p.add_argument("--json", action="store_true", help="with --script: print the turns as JSON at the end")


def _chat(args: argparse.Namespace) -> dict | None:
    import sys
    import time
    from pathlib import Path

    from course.generate import Chat
    from course.models import load_model

    _policy_for(args, args.budget)
    _sampler_check(args)
    if args.json and not args.script:
        raise ValueError("--json needs --script (an interactive chat prints as it goes)")
    script = None
    if args.script:
        script = [line.strip() for line in Path(args.script).read_text(encoding="utf-8").splitlines() if line.strip()]
        if not script:
            raise ValueError(f"--script {args.script} holds no turns (one user message per non-empty line)")
    model, tok = load_model(args.model, args.device, verbose=not args.json)
    policy = _policy_for(args, args.budget, model)
    chat = Chat(model, tok, policy, system=args.system, max_new_tokens=args.max_new_tokens,
                temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    say = (lambda *a, **k: None) if args.json else print
    say(f"{model.config.name} through {policy.label}. " + ("" if script else "Empty line or Ctrl-D to quit."))
    start = time.perf_counter()
    turns = iter(script) if script is not None else iter(lambda: _ask(sys.stdin), "")
    for text in turns:
        say(f"> {text}" if script is not None else "", end="\n" if script is not None else "")
        for step in chat.say(text):
            say(step.text, end="", flush=True)
        t = chat.turns[-1]
        say(f"\n[cache: {t.cache_slots} slots, {t.cache_bytes / 2**20:.2f} MiB; {t.new_tokens} tokens in {t.seconds:.1f} s]")
    out = {"model": model.config.name, "policy": policy.label,
           "turns": [vars(t) for t in chat.turns], "answers": [t.assistant for t in chat.turns],
           "tokens": chat.seen, "max_cache_bytes": max((t.cache_bytes for t in chat.turns), default=0),
           "seconds": round(time.perf_counter() - start, 3)}
    return out if args.json else None


def _ask(stream) -> str:
    """One user line from the terminal ("" at the end of input or on an empty line)."""
    print("you> ", end="", flush=True)
    line = stream.readline()
    return line.strip()


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
    return {"repo": host.read_host(root).repo, "branch": host.read_host(root).branch, "written": [str(p) for p in changed]}


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
                        "released lines) to FILE, outside --out: keep it from the students, grade with it")
    p.add_argument("--seed", type=seed_int, default=None,
                   help="draw the capstone's held-out passages from this seed (default: at random)")
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
    p.add_argument("--json", action="store_true")


def jobs_count(text: str) -> int:
    """argparse type: how many submissions to grade at once, 1 to the cores this process may use."""
    from course.threads import cpu_cores

    cores = cpu_cores()
    try:
        return _int(text, 1, cores)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to {cores} (the cores available here), "
                                         f"got {text!r}") from None


def shard_spec(text: str):
    """argparse type: ``INDEX/COUNT``, a ``course.instructor.grading.shards.Shard``."""
    from course.instructor.grading.shards import Shard

    try:
        return Shard.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--shard ")) from None


def _grade(args: argparse.Namespace) -> dict:
    import signal
    import sys
    import threading
    from pathlib import Path

    from course.instructor import require

    require("grade", "nbformat", "nbclient", "jupyter_client", "ipykernel")
    from course.instructor.grading.gradebook import Gradebook, format_gradebook, totals
    from course.instructor.grading.grade import grade
    from course.instructor.grading.key import read_key
    from course.instructor.grading.sandbox import Limits
    from course.instructor.grading.shards import check_out_for
    from course.instructor.grading.submissions import find_submissions
    from course.threads import cpu_cores

    shard = args.shard
    jobs = args.jobs or cpu_cores()
    read_key(Path(args.key))  # an unusable key is reported before anything is graded
    find_submissions(args.paths, args.layout)  # a missing PATH is reported before --out is created
    check_out_for(Path(args.out), shard)
    book = Gradebook(Path(args.out), regrade=args.regrade)  # checked before anything is graded
    total = args.total_timeout or 6 * args.timeout
    limits = Limits(cpu_seconds=2 * total, memory_mb=args.memory, output_mb=args.max_output)

    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        if not stopping.is_set():  # a second signal must not cut the clean-up short
            stopping.set()
            raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rows = grade(args.paths, args.timeout, args.total_timeout, args.layout, limits, book,
                     progress=None if args.json else lambda line: print(line, flush=True), stop=stopping,
                     jobs=jobs, threads=max(1, cpu_cores() // jobs), shard=shard, key=Path(args.key))
    except KeyboardInterrupt:
        print(f"interrupted: {book.json_path} and {book.csv_path} hold the submissions graded so far; "
              "run the same command again to grade the rest", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if not args.json:
        print(format_gradebook(rows))
        print(f"wrote {book.csv_path} and {book.json_path}" + (f" (shard {shard})" if shard else ""))
    return {"rows": rows, "totals": totals(rows), "gradebook": [str(book.csv_path), str(book.json_path)],
            "jobs": jobs, "shard": str(shard) if shard else None}


def _gradebook_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    merge = sub.add_parser("merge", help="merge the gradebooks of every shard (grade --shard i/N) into one",
                           description="merge the gradebooks of every shard (grade --shard i/N) into one; refuses "
                                       "missing, unfinished or overlapping shards")
    merge.add_argument("shards", nargs="+", metavar="SHARD_DIR", help="the --out folder of every shard")
    merge.add_argument("--out", required=True, help="folder for the merged gradebook.csv and gradebook.json")
    merge.add_argument("--json", action="store_true")


def _gradebook(args: argparse.Namespace) -> dict:
    from course.instructor.grading.gradebook import totals
    from course.instructor.grading.shards import merge

    book = merge(args.shards, args.out)
    if not args.json:
        people = len(totals(book.rows))
        print(f"merged {len(args.shards)} shards: {len(book.rows)} rows for {people} student(s) in "
              f"{book.csv_path} and {book.json_path}")
    return {"rows": book.rows, "totals": totals(book.rows), "gradebook": [str(book.csv_path), str(book.json_path)]}


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


# ----------------------------------------------------------------------------- reproductions
def _reproductions_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="source", default="outputs",
                   help="folder of executed notebooks (default: ./outputs, written by run-course.sh --execute)")
    p.add_argument("--out", default="docs/reproductions.md", help="the page to write (default: docs/reproductions.md)")
    p.add_argument("--json", action="store_true")


def _reproductions(args: argparse.Namespace) -> dict:
    from course.instructor.reproductions import write_reproductions

    result = write_reproductions(args.source, args.out)
    if not args.json:
        counts = ", ".join(f"{n} {v}" for v, n in result["verdicts"].items())
        print(f"{result['rows']} reproduction rows ({counts}) -> {result['out']}")
    return result


COMMANDS: list[Command] = [
    Command("fetch", "download the offline model and corpus into the course cache", _fetch_args, _fetch),
    Command("info", "show device, versions, and which models and corpora are available", _info_args, _info),
    Command("stream", "perplexity of a long text streamed through a bounded KV cache", _stream_args, _stream),
    Command("needle", "passkey retrieval after compressing the prompt's cache to a budget", _needle_args, _needle),
    Command("generate", "generate text through a cache managed by a policy", _generate_args, _generate),
    Command("chat", "a terminal chat through a bounded cache (or --script FILE of turns)", _chat_args, _chat),
    Command("train", "pretrain a tiny model with or without a sink token / sink logit", _train_args, _train),
    Command("bench", "speed and memory: ratios measured side by side in one run", _bench_args, _bench),
    Command("host", "where the course lives: the Colab cells and README links follow pyproject.toml", _host_args,
            _host),
    Command("release", "write the student copies of the notebooks (exercise solutions removed)", _release_args,
            _release),
    Command("grade", "autograde submitted notebooks into a gradebook (CSV and JSON)", _grade_args, _grade),
    Command("gradebook", "gradebooks: merge the shards of a grading split over several machines", _gradebook_args,
            _gradebook),
    Command("check-outputs", "check executed notebooks for frozen progress bars, widget text, loading messages",
            _check_outputs_args, _check_outputs),
    Command("reproductions", "the reproduction table (paper vs course, verdicts) from executed notebooks",
            _reproductions_args, _reproductions),
    Command("site", "build the course site (HTML pages of the executed notebooks, index, benchmarks)", _site_args,
            _site),
]
