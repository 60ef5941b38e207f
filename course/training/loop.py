"""The training loop of the tiny models, and the run cache it reads and writes.

Runs are cached under ``<course cache>/runs/<name>-<hash>/`` (weights + JSON log; the name is
``TrainConfig.run_name``): training again with the same configuration loads the stored run unless ``retrain=True``.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from course.assets import CacheUnusable, cache_dir, ensure_writable
from course.manifest import sha256_of, write_atomic
from course.models import build_model
from course.progress import progress_bar
from course.training.measure import sink_mass_of
from course.training.tasks import BigramBackcopy, TextBytes, lm_loss, make_task
from course.training.variants import TrainConfig, TrainRun, model_config

__all__ = ["train"]


def _optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2 and "emb" not in n]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and not (p.dim() >= 2 and "emb" not in n)]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def _lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.schedule == "cosine":
        progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
    return cfg.lr


def _load_run(cfg: TrainConfig, path: Path, vocab: int, device: str | torch.device) -> tuple[TrainRun | None, str]:
    """The stored run of ``cfg`` (None, "" when there is none; None, what is wrong when it is damaged)."""
    weights, log = path / "model.pt", path / "log.json"
    if not weights.is_file() and not log.is_file():
        return None, ""
    try:
        info = json.loads(log.read_text(encoding="utf-8"))
        if not isinstance(info, dict) or not isinstance(info.get("log"), list) or "seconds" not in info:
            raise ValueError("log.json lacks its log or time")
        if "model_sha256" in info and sha256_of(weights) != info["model_sha256"]:
            raise ValueError("model.pt does not match the SHA-256 recorded in log.json")
        model = build_model(model_config(cfg, vocab))
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    except (OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError, KeyError) as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'unreadable'}"
    return TrainRun(cfg, model.to(device).eval(), info["log"], float(info["seconds"]), path, loaded=True), ""


def _save_run(run: TrainRun) -> None:
    """Write model.pt, then log.json (with model.pt's SHA-256), each through a renamed temporary file."""
    assert run.path is not None
    run.path.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(run.model.state_dict(), buffer)
    write_atomic(run.path / "model.pt", buffer.getvalue())
    record = {"config": asdict(run.config), "log": run.log, "seconds": run.seconds,
              "model_sha256": sha256_of(run.path / "model.pt")}
    write_atomic(run.path / "log.json", json.dumps(record).encode())


def _stored_run(cfg: TrainConfig, path: Path, vocab: int, device: str | torch.device, retrain: bool,
                save: bool) -> TrainRun | None:
    """The intact stored run of ``cfg`` (unless ``retrain``), or None after checking that a new one can be saved."""
    damage = ""
    if not retrain:
        stored, damage = _load_run(cfg, path, vocab, device)
        if stored is not None:
            return stored
        if damage:
            print(f"the stored run {path} is damaged ({damage}); training it again", file=sys.stderr, flush=True)
    if save:
        try:
            ensure_writable(path.parent)
        except CacheUnusable as e:
            raise CacheUnusable(f"the stored run {path} is damaged ({damage}) and cannot be trained again: {e}"
                                if damage else f"cannot save the run: {e}") from None
    return None


def _fit(run: TrainRun, task: BigramBackcopy | TextBytes, device: str | torch.device, progress: bool) -> None:
    """Train ``run.model`` for ``run.config.steps`` steps, appending to ``run.log`` every ``log_every`` steps."""
    cfg, model = run.config, run.model
    opt = _optimizer(model, cfg)
    g = torch.Generator().manual_seed(cfg.seed)
    probe = task.sample(32, cfg.seq_len, torch.Generator().manual_seed(10_000 + cfg.seed)).to(device)
    start = time.perf_counter()
    bar = progress_bar(range(cfg.steps), desc=f"train {cfg.variant} seed {cfg.seed}", enabled=progress)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, cfg)
        x = run.inputs(task.sample(cfg.batch, cfg.seq_len, g).to(device))
        model.train()
        loss = lm_loss(model(x).logits, x, run.n_prefix)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            model.eval()
            mass = sink_mass_of(run, probe)
            run.log.append({"step": step, "loss": round(loss.item(), 4), "sink_mass": round(mass, 4),
                            "seconds": round(time.perf_counter() - start, 1)})
            bar.set_postfix(loss=f"{loss.item():.3f}", sink=f"{mass:.2f}", refresh=False)
    run.seconds = time.perf_counter() - start
    model.eval()


def train(cfg: TrainConfig, device: str | torch.device = "cpu", progress: bool = True, retrain: bool = False,
          save: bool = True) -> TrainRun:
    """Train (or load the stored run of) ``cfg``. Logs loss and sink mass every ``log_every`` steps.

    A stored run that is damaged (truncated weights or log) is trained again. With ``save``, the
    run folder must be writable: that is checked before training starts, not after."""
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    path = cache_dir() / "runs" / cfg.run_name
    task = make_task(cfg.task)
    stored = _stored_run(cfg, path, task.vocab, device, retrain, save)
    if stored is not None:
        return stored
    torch.manual_seed(cfg.seed)
    model = build_model(model_config(cfg, task.vocab))
    model.init_weights()
    model.to(device)
    run = TrainRun(cfg, model, path=path)
    _fit(run, task, device, progress)
    if save:
        _save_run(run)
    return run
