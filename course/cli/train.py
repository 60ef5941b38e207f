"""``train``: tiny models with or without a sink token, a sink logit or an output gate (notebook 06)."""

from __future__ import annotations

import argparse
from course.cli.args import Command, device_name, positive_int, seed_int
from course.model_names import SEED_MAX, VARIANTS


# ----------------------------------------------------------------------------- train
def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variant", default="sink-token", choices=VARIANTS)
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
                        "model uses two cores poorly: 2 jobs on 2 cores train notebook 06's 18 models in 8-9 "
                        "minutes instead of 11-12")
    p.add_argument("--json", action="store_true")


def _train(args: argparse.Namespace) -> dict:
    """One run: its numbers. Several (--all-variants, --seeds): {"runs": [the numbers of each]}."""
    from course.models import resolve_device
    from course.train import measure_run, seed_list

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
    options = dict(task=args.task, preset=args.preset, steps=args.steps, windows=args.windows, device=dev,
                   retrain=args.retrain)
    if args.jobs == 1 or len(todo) == 1:
        runs = []
        for variant, seed, bos in todo:
            runs.append(measure_run(variant, seed, bos, **options, progress=not args.json))
            if not args.json:
                _print_run(runs[-1])
    else:
        runs = _train_in_processes(args, todo, options)
    return runs[0] if len(runs) == 1 else {"runs": runs}


def _train_in_processes(args: argparse.Namespace, todo: list[tuple[str, int, bool]], options: dict) -> list[dict]:
    """``measure_in_processes`` with ``args.jobs`` processes, each run's summary printed as it ends."""
    from course.train import measure_in_processes, process_split

    jobs, threads = process_split(args.jobs, len(todo))
    if not args.json:
        print(f"training {len(todo)} runs, {jobs} at once ({threads} thread{'s' if threads > 1 else ''} each)")

    def done(i: int, out: dict) -> None:
        if not args.json:
            print(f"[{i}/{len(todo)}] ", end="")
            _print_run(out)

    return measure_in_processes(todo, args.jobs, done, **options)


def _print_run(out: dict) -> None:
    """The summary of one training run (``measure_run``'s numbers)."""
    print(f"{out['variant']} on {out['task']}{' (samples begin with BOS)' if out['bos'] else ''}, seed {out['seed']}: "
          f"{out['steps']} steps in {out['seconds']} s"
          f"{' (loaded from the cache)' if out['loaded_from_cache'] else ''}; "
          f"final training loss {out['final_loss']:.3f}")
    if out["variant"] in ("sink-logit", "off-by-one"):
        print(f"attention on the sink logit: {out['sink_mass']:.3f}")
    print(f"attention on position 0: {out['attention_on_first']:.3f} (uniform {out['uniform_first']:.3f});  "
          f"held-out loss, full attention: {out['full_loss']:.4f}")
    for w, row in out["window_loss"].items():
        print(f"  window {w.removeprefix('W='):>3s}: " + "  ".join(f"{k} kept: {v:.4f}" for k, v in row.items()))


COMMANDS = [
    Command("train", "pretrain a tiny model with or without a sink token / sink logit", _train_args, _train),
]
