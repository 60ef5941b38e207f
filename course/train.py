"""Pretraining tiny models, with and without a place for attention to rest.

Where do attention sinks come from? We train small models of the course's own families ourselves,
on a task small enough for a CPU, in five variants:

* ``vanilla``: sequences start directly with content;
* ``sink-token``: a dedicated learnable start token is prepended to every sample (StreamingLLM
  section 3.3's [SINK]); it is input only, never a prediction target;
* ``sink-logit``: no start token, but every head has a learned logit for an empty slot that takes
  part in the softmax (attention can go "nowhere");
* ``off-by-one``: that logit fixed at 0, i.e. softmax with 1 added to its denominator;
* ``gated``: gated attention (Qiu et al. 2025, arXiv 2505.06708): a sigmoid gate, computed from the query
  token, on every output dimension of every head, before the output projection
  (``course.models.base.output_gate``), so that a head can output ~0 without a place to rest.

The task, Bigram-Backcopy (Guo et al. 2024, *Active-Dormant Attention Heads*): tokens follow a
fixed random bigram chain, except that right after one of a few trigger tokens the next token
copies the token before the trigger. Copying needs attention only at triggers; everywhere else a
copy head has nothing to read — exactly the situation in which heads learn to park attention on
a sink. ``task="text"`` trains on Austen (bytes) for the contrast: at CPU scale, natural text does
not make a model grow a sink of its own (with a sink token, though, the model uses it).

Runs are cached under ``<course cache>/runs/<name>-<hash>/`` (weights + JSON log): training again
with the same configuration loads the stored run unless ``retrain=True``. One trained model is an
anecdote: ``train_seeds`` trains a variant once per seed (at least ``MIN_SEEDS``), ``over_seeds`` sums a
metric up over them.

The pieces live in ``course.training``: ``tasks`` (the data), ``variants`` (the configurations and the models
they build), ``loop`` (training and the run cache) and ``measure`` (what a trained model is asked). This module
is the course's one door to them, and holds what spans several runs: the seeds, Table 3 and the thresholds.
"""

from __future__ import annotations

import math

import torch

from course.claims import Rule
from course.model_names import SEED_MAX
from course.papers import value
from course.passages import spread
from course.stats import MIN_FOR_CLAIM
from course.training.loop import train
from course.training.measure import (
    attention_on_first,
    attention_on_sink,
    copy_head_profile,
    sink_mass_of,
    uniform_first,
    window_losses,
)
from course.training.tasks import BigramBackcopy, TextBytes, lm_loss, make_task, prepend_sink
from course.training.variants import (
    MIN_SEEDS,
    PRESETS,
    VARIANTS,
    TrainConfig,
    TrainRun,
    Variant,
    model_config,
    variant_config,
)

__all__ = [
    "TrainConfig", "TrainRun", "BigramBackcopy", "TextBytes", "PRESETS", "VARIANTS", "train", "sink_mass_of",
    "window_losses", "copy_head_profile", "attention_on_first", "uniform_first", "make_task", "prepend_sink",
    "lm_loss", "variant_config", "attention_on_sink", "measure_run", "measure_in_processes", "process_split",
    "MIN_SEEDS", "seed_list", "train_seeds", "over_seeds", "THRESHOLDS", "TABLE3", "table3_excess", "verdict",
    "table3_rule", "agreement", "TABLE3_QUANTITIES", "GATE_RATIO", "Variant", "model_config",
]


# ----------------------------------------------------------------------------- several seeds
def seed_list(seed: int, n: int = MIN_SEEDS) -> list[int]:
    """The seeds a training result is reported over: ``[seed, seed + 1, ..., seed + n - 1]``.

    One trained model is an anecdote: ``n`` must be at least ``MIN_SEEDS``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < MIN_SEEDS:
        raise ValueError(f"the number of seeds must be an integer >= {MIN_SEEDS} (one trained model is an anecdote), "
                         f"got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX - n + 1:
        raise ValueError(f"seed must be an integer from 0 to {SEED_MAX - n + 1} (so that all {n} seeds are valid), "
                         f"got {seed!r}")
    return list(range(seed, seed + n))


def train_seeds(variant: str, preset: str, seeds: list[int], device: str | torch.device = "cpu",
                progress: bool = True, retrain: bool = False, **overrides) -> list[TrainRun]:
    """``variant`` trained (or loaded from the cache) once per seed, in the order of ``seeds``."""
    if len(seeds) < MIN_SEEDS or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be at least {MIN_SEEDS} different seeds, got {seeds!r}")
    return [train(variant_config(variant, preset, seed=s, **overrides), device, progress=progress, retrain=retrain)
            for s in seeds]


def over_seeds(values, fmt: str = ".3f") -> str:
    """One line about a metric measured once per seed: median, mean and range (at least two finite values)."""
    s = spread(values)
    return (f"median {s.median:{fmt}}, mean {s.mean:{fmt}}, range {s.low:{fmt}} to {s.high:{fmt}} "
            f"over {len(s.values)} seeds")


# ----------------------------------------------------------------------------- Table 3 and the thresholds
THRESHOLDS = {
    "T1": 0.05,  # a sink that matters: excess loss with 0 kept first tokens >= 0.05 nats (~5 % perplexity)
    "T2": 0.01,  # a fix works: excess loss with k kept first tokens <= 0.01 nats (~1 % perplexity)
    "T3": 0.02,  # needs more than one: excess(1 kept) - excess(4 kept) >= 0.02 nats
    "T4": 4.0,   # a sink formed: attention on position 0 >= 4 x what uniform attention would give it
}
# Gated attention's claim (Qiu et al. 2025): the gate removes most of the sink. Judged per gated seed on its
# attention on position 0 over the vanilla models' median (unpaired: the two architectures consume the random
# stream differently, so seeds do not pair them): at most a half (fixed before any gated run).
GATE_RATIO = 0.5

# StreamingLLM (Xiao et al., arXiv 2309.17453), Table 3: perplexity of three 160M models pretrained from
# scratch (section 3.3) with a cache of 0+1024, 1+1023, 2+1022, 4+1020 (kept first tokens + recent tokens).
TABLE3 = {variant: {k: value("streamingllm.table3", f"{row} {k}") for k in (0, 1, 2, 4)}  # from course.papers
          for variant, row in (("vanilla", "vanilla"), ("off-by-one", "zero sink"),  # zero sink: Miller (2023)
                               ("sink-token", "sink token"))}


def table3_excess(variant: str, kept: int) -> float | None:
    """Table 3 in this notebook's units: ln(PPL with ``kept`` first tokens / PPL with 4 kept), in nats.

    The paper reports no full-attention perplexity for these models, so its 4+1020 column is the
    reference. None for a variant the paper did not train (the learned sink logit)."""
    if variant not in TABLE3:
        return None
    if kept not in TABLE3[variant]:
        raise ValueError(f"kept must be one of {sorted(TABLE3[variant])}, got {kept!r}")
    return math.log(TABLE3[variant][kept] / TABLE3[variant][4])


TABLE3_QUANTITIES = {  # what each threshold is measured on, per seed (nats, at the smallest window)
    "T1": "excess loss with 0 kept",
    "T2": "excess loss with the kept first slots",
    "T3": "excess(1 kept) - excess(4 kept)",
}


def table3_rule(finding: str, test: str, paper: bool = True) -> Rule:
    """The rule for one of Table 3's findings, judged on the per-seed values of ``test`` ("T1", "T2@k" or "T3",
    thresholds ``THRESHOLDS``, whose history docs/thresholds.md gives): the finding is reproduced when the whole
    range over the seeds is on the paper's side of the threshold (``paper``: whether the threshold holds for
    Table 3's numbers), not reproduced at this scale when the whole range is on the other side, and inconclusive
    at n = (the number of seeds) when the seeds fall on both sides (``course.claims.Rule``)."""
    kind = test.split("@")[0]
    if kind not in TABLE3_QUANTITIES:
        raise ValueError(f"test must be T1, T2@k or T3, got {test!r}")
    limit = THRESHOLDS[kind]
    holds_above = kind != "T2"            # T1 and T3 hold at or above their threshold, T2 at or below
    side = "at_least" if holds_above == bool(paper) else "at_most"
    return Rule(f"{finding}: {TABLE3_QUANTITIES[kind]} (nats), range over seeds", **{side: limit},
                why=f"{kind} = {limit:g} nats (when and on what runs it was set: docs/thresholds.md); the paper's "
                    f"Table 3 {'meets' if paper else 'misses'} it")


def agreement(ours: list[bool], paper: bool) -> float:
    """The share of seeds whose outcome (``ours``: whether a threshold held, per seed) is the paper's."""
    if not ours:
        raise ValueError("ours must hold one outcome per seed, got none")
    return sum(bool(o) == bool(paper) for o in ours) / len(ours)


def verdict(ours: list[bool], paper: bool | None) -> str:
    """Does a threshold's outcome in our seeds agree with the paper's? The verdict ``table3_rule`` gives the
    per-seed values: "reproduced" when every seed agrees, "not reproduced at this scale" when none does,
    "inconclusive at n = <seeds>" when the seeds disagree or are fewer than ``course.stats.MIN_FOR_CLAIM``.
    ``paper`` None (the paper has no such model): in how many seeds it held."""
    if not ours:
        raise ValueError("ours must hold one outcome per seed, got none")
    if paper is None:
        return f"held in {sum(bool(o) for o in ours)}/{len(ours)} seeds (not in the paper)"
    share = agreement(ours, paper)
    if share not in (0, 1) or len(ours) < MIN_FOR_CLAIM:  # seeds that disagree, or too few for a verdict
        return f"inconclusive at n = {len(ours)}"
    return "reproduced" if share == 1 else "not reproduced at this scale"


def measure_run(variant: str, seed: int, bos: bool, *, task: str, preset: str, steps: int | None,
                windows: list[int], device: str | torch.device, retrain: bool = False, progress: bool = True) -> dict:
    """Train (or load) one run and measure it on 64 held-out samples: its final training loss, the attention on
    its sink and on position 0, and the held-out loss with full attention and with each recent window in
    ``windows`` (0, 1, 2 or 4 first tokens kept). Returns the numbers as a JSON-ready dict."""
    overrides = {"task": task, "seed": seed, "bos": bos}
    if steps is not None:
        overrides["steps"] = steps
    cfg = variant_config(variant, preset, **overrides)
    run = train(cfg, device, progress=progress, retrain=retrain)
    held_out = make_task(cfg.task).sample(64, cfg.seq_len, torch.Generator().manual_seed(99_999)).to(device)
    losses = window_losses(run, held_out, windows, [0, 1, 2, 4])
    return {
        "variant": cfg.variant, "task": cfg.task, "bos": cfg.bos, "preset": preset, "seed": cfg.seed,
        "steps": cfg.steps,
        "seconds": round(run.seconds, 1), "loaded_from_cache": run.loaded, "final_loss": run.log[-1]["loss"],
        "sink_mass": sink_mass_of(run, held_out),
        "attention_on_first": float(attention_on_first(run, held_out).mean()),
        "uniform_first": uniform_first(run.inputs(held_out).shape[1]), "full_loss": losses["full"],
        "window_loss": {f"W={w}": {str(k): v for k, v in row.items()} for w, row in losses["windows"].items()},
        "run_dir": str(run.path),
    }


def _set_threads(n: int) -> None:
    torch.set_num_threads(n)


def process_split(jobs: int, runs: int) -> tuple[int, int]:
    """(processes, torch threads each) for ``runs`` runs trained ``jobs`` at once on this machine's cores."""
    from course.threads import share_of_cores

    processes = min(jobs, runs)
    return processes, share_of_cores(processes)


def measure_in_processes(todo: list[tuple[str, int, bool]], jobs: int, on_done=None, **options) -> list[dict]:
    """``measure_run`` for every (variant, seed, bos) of ``todo``, ``jobs`` at once, each in its own process with
    cores / jobs threads and no progress bars; ``on_done(i, numbers)`` is called as each run ends, in the order
    given. ``options``: ``measure_run``'s keywords. Returns the runs' numbers in the order of ``todo``."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    jobs, threads = process_split(jobs, len(todo))
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_set_threads, initargs=(threads,)) as pool:
        futures = [pool.submit(measure_run, variant, seed, bos, **options, progress=False)
                   for variant, seed, bos in todo]
        runs = []
        for i, future in enumerate(futures, 1):
            runs.append(future.result())
            if on_done is not None:
                on_done(i, runs[-1])
    return runs
