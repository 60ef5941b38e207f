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
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import pickle
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from course.assets import CacheUnusable, cache_dir, ensure_writable
from course.claims import Rule
from course.manifest import sha256_of, write_atomic
from course.model_names import SEED_MAX, VARIANTS
from course.models import build_model
from course.models.base import CausalLM, ModelConfig
from course.papers import value
from course.passages import spread
from course.policies import make_policy
from course.progress import progress_bar
from course.streaming import exact_stream

__all__ = [
    "TrainConfig", "TrainRun", "BigramBackcopy", "TextBytes", "PRESETS", "VARIANTS", "train", "sink_mass_of",
    "window_losses", "copy_head_profile", "attention_on_first", "uniform_first", "make_task", "prepend_sink",
    "lm_loss", "variant_config", "attention_on_sink", "measure_run", "measure_in_processes", "process_split",
    "MIN_SEEDS", "seed_list", "train_seeds", "over_seeds", "THRESHOLDS", "TABLE3", "table3_excess", "verdict",
    "table3_rule", "agreement", "TABLE3_QUANTITIES", "GATE_RATIO",
]

Variant = Literal["vanilla", "sink-token", "sink-logit", "off-by-one", "gated"]


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a run (its hash names the run's folder)."""

    variant: Variant = "sink-token"
    task: Literal["bigram-backcopy", "text"] = "bigram-backcopy"
    steps: int = 2000
    batch: int = 64
    seq_len: int = 64  # content tokens per sample (the sink token comes on top)
    lr: float = 1e-2
    warmup: int = 100
    schedule: Literal["constant", "cosine"] = "constant"
    weight_decay: float = 0.1  # on weight matrices only
    betas: tuple[float, float] = (0.9, 0.98)
    clip: float = 1.0  # gradient-norm clipping (0: none)
    n_layer: int = 3
    n_head: int = 4
    d_model: int = 64
    d_ff: int = 256
    qkv_bias: bool = False  # Llama only (GPT-2 always has biases)
    family: Literal["gpt2", "llama"] = "gpt2"
    seed: int = 0
    log_every: int = 50
    bos: bool = False  # every sample begins with the same start token (a tokenizer's BOS), as input only

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {self.variant!r}")
        if self.task not in ("bigram-backcopy", "text"):
            raise ValueError(f"task must be 'bigram-backcopy' or 'text'; got {self.task!r}")
        for name in ("steps", "batch", "seq_len", "n_layer", "n_head", "d_model", "d_ff", "log_every", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if not 0 <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be an integer from 0 to {SEED_MAX}, got {self.seed}")
        for name in ("steps", "batch", "seq_len", "n_layer", "n_head", "d_model", "d_ff", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 8:
            raise ValueError(f"seq_len must be >= 8, got {self.seq_len}")
        if not 0 < self.lr < 1:
            raise ValueError(f"lr must be in (0, 1), got {self.lr}")
        if not isinstance(self.bos, bool):
            raise ValueError(f"bos must be True or False, got {self.bos!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")

    @property
    def run_name(self) -> str:
        fields = asdict(self)
        if not self.bos:  # runs stored before the option existed keep their names
            del fields["bos"]
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.task}-{'bos-' if self.bos else ''}{self.variant}-seed{self.seed}-{digest}"

    @property
    def n_prefix(self) -> int:
        """Input tokens in front of the content that are never prediction targets: [SINK] and/or BOS."""
        return int(self.variant == "sink-token") + int(self.bos)


PRESETS = {
    # fast: 2 layers, 32-token samples, 600 steps (about 40 s per model on two CPU cores)
    "fast": {"steps": 600, "n_layer": 2, "seq_len": 32, "warmup": 50, "bos": True},
    "full": {"steps": 4000, "bos": True},
}
MIN_SEEDS = 3  # every training result is reported over at least this many seeds


# ----------------------------------------------------------------------------- tasks
class BigramBackcopy:
    """Bigram-Backcopy sequences over ``vocab`` content tokens (ids 0..vocab-1).

    Transition rows: Dirichlet(alpha) mixed with ``uniform`` of a uniform row. The triggers are
    the most frequent tokens of the chain; after a trigger the next token copies the token
    before the trigger. Fixed by ``seed``.
    """

    def __init__(self, vocab: int = 64, n_triggers: int = 3, alpha: float = 0.05, uniform: float = 0.02,
                 seed: int = 1234) -> None:
        self.vocab = vocab
        dirichlet = torch.distributions.Dirichlet(torch.full((vocab,), alpha))
        with torch.random.fork_rng(devices=[]):  # Dirichlet sampling uses the global generator: leave it as it was
            torch.manual_seed(seed)
            rows = dirichlet.sample((vocab,))
        self.transition = (1 - uniform) * rows + uniform / vocab  # [V, V]
        stationary = torch.full((vocab,), 1.0 / vocab)
        for _ in range(200):  # power iteration: how often each token occurs in a long chain
            stationary = stationary @ self.transition
        self.triggers = stationary.topk(n_triggers).indices  # the most frequent tokens, as in Guo et al.
        self.is_trigger = torch.zeros(vocab, dtype=torch.bool)
        self.is_trigger[self.triggers] = True

    def sample(self, batch: int, length: int, generator: torch.Generator) -> Tensor:
        """[batch, length] content tokens."""
        x = torch.empty(batch, length, dtype=torch.long)
        non_trigger = (~self.is_trigger).float()
        x[:, 0] = torch.multinomial(non_trigger.expand(batch, -1), 1, generator=generator)[:, 0]
        for t in range(1, length):
            nxt = torch.multinomial(self.transition[x[:, t - 1]], 1, generator=generator)[:, 0]
            if t >= 2:
                copy = self.is_trigger[x[:, t - 1]]
                nxt = torch.where(copy, x[:, t - 2], nxt)
            x[:, t] = nxt
        return x

    def copy_targets(self, x: Tensor) -> Tensor:
        """[B, T] bool: positions whose token is a copy (the token before them is a trigger)."""
        out = torch.zeros_like(x, dtype=torch.bool)
        out[:, 2:] = self.is_trigger[x[:, 1:-1]]
        return out


class TextBytes:
    """Austen as bytes (vocabulary 256): random windows of the novels."""

    def __init__(self) -> None:
        from course.data import load_text

        self.data = torch.frombuffer(bytearray(load_text("austen").encode("utf-8")), dtype=torch.uint8)
        self.vocab = 256

    def sample(self, batch: int, length: int, generator: torch.Generator) -> Tensor:
        starts = torch.randint(0, len(self.data) - length - 1, (batch,), generator=generator)
        return torch.stack([self.data[s : s + length] for s in starts.tolist()]).long()


def make_task(name: str):
    return BigramBackcopy() if name == "bigram-backcopy" else TextBytes()


# ----------------------------------------------------------------------------- the pieces students write
def prepend_sink(x: Tensor, sink_id: int) -> Tensor:
    """Put the sink token in front of every sample: [B, T] -> [B, T + 1]."""
    return torch.cat([torch.full_like(x[:, :1], sink_id), x], dim=1)


def lm_loss(logits: Tensor, inputs: Tensor, n_prefix: int) -> Tensor:
    """Next-token loss on the content only.

    logits: [B, N, V] for inputs [B, N] whose first ``n_prefix`` tokens are a prefix (the sink
    token) that is never a prediction target. Position i predicts token i + 1.
    """
    targets = inputs[:, max(n_prefix, 1) :]
    preds = logits[:, max(n_prefix, 1) - 1 : -1]
    return F.cross_entropy(preds.reshape(-1, preds.shape[-1]), targets.reshape(-1))


# ----------------------------------------------------------------------------- model and run
def model_config(cfg: TrainConfig, vocab: int) -> ModelConfig:
    """The model of a run: ``vocab`` content tokens, then the sink token's id, then (with ``bos``) the BOS id."""
    sink_logit = {"sink-logit": "learned", "off-by-one": "zero"}.get(cfg.variant, "none")
    return ModelConfig(
        family=cfg.family, vocab_size=vocab + 1 + int(cfg.bos), n_layer=cfg.n_layer, n_head=cfg.n_head, n_kv_head=cfg.n_head,
        d_model=cfg.d_model, head_dim=cfg.d_model // cfg.n_head, d_ff=cfg.d_ff, max_positions=4 * (cfg.seq_len + 1 + int(cfg.bos)),
        rope_theta=10000.0, tie_embeddings=True, sink_logit=sink_logit, qkv_bias=cfg.qkv_bias, name=f"tiny-{cfg.variant}",
        output_gate="elementwise" if cfg.variant == "gated" else "none",
    )


@dataclass
class TrainRun:
    """A trained model, its configuration and its log (one dict per logged step)."""

    config: TrainConfig
    model: CausalLM
    log: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    path: Path | None = None
    loaded: bool = False

    @property
    def n_prefix(self) -> int:
        return self.config.n_prefix

    @property
    def sink_id(self) -> int:
        return self.model.config.vocab_size - 1 - int(self.config.bos)

    @property
    def bos_id(self) -> int | None:
        return self.model.config.vocab_size - 1 if self.config.bos else None

    def inputs(self, x: Tensor) -> Tensor:
        """Model inputs for content tokens x [B, T]: [SINK] (that variant), then BOS (``bos``), then x."""
        if self.config.bos:
            x = prepend_sink(x, self.bos_id)
        return prepend_sink(x, self.sink_id) if self.config.variant == "sink-token" else x


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


def train(cfg: TrainConfig, device: str | torch.device = "cpu", progress: bool = True, retrain: bool = False,
          save: bool = True) -> TrainRun:
    """Train (or load the stored run of) ``cfg``. Logs loss and sink mass every ``log_every`` steps.

    A stored run that is damaged (truncated weights or log) is trained again. With ``save``, the
    run folder must be writable: that is checked before training starts, not after."""
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    path = cache_dir() / "runs" / cfg.run_name
    task = make_task(cfg.task)
    damage = ""
    if not retrain:
        stored, damage = _load_run(cfg, path, task.vocab, device)
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

    torch.manual_seed(cfg.seed)
    model = build_model(model_config(cfg, task.vocab))
    model.init_weights()
    model.to(device)
    run = TrainRun(cfg, model, path=path)
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
    if save:
        _save_run(run)
    return run


# ----------------------------------------------------------------------------- measurements
@torch.inference_mode()
def attention_on_sink(run: TrainRun, x: Tensor, skip: int = 4) -> Tensor:
    """Attention share each (layer, head) gives to its resting place: [layers, heads].

    For the sink-logit variants, the share of the empty slot (1 - the weights on real keys);
    otherwise the weight on position 0 (the sink token, or the first content token). Queries
    before ``skip`` are left out."""
    out = run.model(run.inputs(x), output_attentions=True)
    rows = []
    for w in out.attentions:  # [B, H, N, N]
        w = w[:, :, skip:]
        share = 1 - w.sum(-1) if run.model.config.sink_logit != "none" else w[..., 0]
        rows.append(share.mean(dim=(0, 2)))
    return torch.stack(rows)


@torch.inference_mode()
def attention_on_first(run: TrainRun, x: Tensor, skip: int = 4) -> Tensor:
    """Attention weight each (layer, head) puts on input position 0, whatever the variant: [layers, heads].

    Position 0 is the sink token, the BOS token or the first content token. Queries before ``skip``
    are left out (compare with ``uniform_first(run.inputs(x).shape[1], skip)``)."""
    out = run.model(run.inputs(x), output_attentions=True)
    return torch.stack([w[:, :, skip:, 0].mean(dim=(0, 2)) for w in out.attentions])


def uniform_first(n_tokens: int, skip: int = 4) -> float:
    """The weight on position 0 if every query from ``skip`` to ``n_tokens - 1`` attended uniformly
    to the keys it may see (query q sees q + 1 keys), averaged over those queries."""
    if not 0 <= skip < n_tokens:
        raise ValueError(f"skip must be in [0, n_tokens), got skip={skip}, n_tokens={n_tokens}")
    return sum(1 / (q + 1) for q in range(skip, n_tokens)) / (n_tokens - skip)


def sink_mass_of(run: TrainRun, x: Tensor) -> float:
    """Mean over layers and heads of ``attention_on_sink``."""
    return float(attention_on_sink(run, x).mean())


@torch.inference_mode()
def window_losses(run: TrainRun, x: Tensor, windows: list[int], sinks: list[int]) -> dict:
    """Held-out loss (nats per content token) with a rolling cache of ``k`` kept first slots +
    ``W`` recent tokens (positions inside the cache), for every W and k; and with full attention.

    x: [B, T] content tokens. The kept first slots are the first tokens of the model's input:
    the sink token (then content) for the sink-token variant, content otherwise.
    Returns {"full": loss, "windows": {W: {k: loss}}}.
    """
    inputs = run.inputs(x)
    n_prefix = run.n_prefix
    full = lm_loss(run.model(inputs).logits, inputs, n_prefix).item()
    table: dict[int, dict[int, float]] = {}
    for w in windows:
        table[w] = {}
        for k in sinks:
            r = exact_stream(run.model, inputs, make_policy("streaming", k + w, sinks=k, model=run.model), progress=False)
            table[w][k] = r.nll[:, max(n_prefix, 1) - 1 :].mean().item()
    return {"full": full, "windows": table}


@torch.inference_mode()
def copy_head_profile(run: TrainRun, x: Tensor) -> dict:
    """Find the copy head and how it behaves (Bigram-Backcopy only).

    For every (layer, head): ``active`` = mean attention, at queries whose next token is a copy,
    on the token to copy (two back); ``dormant`` = mean attention on the resting place at the
    other queries. Returns both as [layers, heads] and the (layer, head) with the highest active score.
    """
    task = make_task(run.config.task)
    if not isinstance(task, BigramBackcopy):
        raise ValueError("copy_head_profile needs the bigram-backcopy task")
    out = run.model(run.inputs(x), output_attentions=True)
    n_prefix = run.n_prefix
    is_copy = task.copy_targets(x.cpu())  # [B, T] over content positions
    # query at input position q predicts content token q + 1 - n_prefix; copy source is content q - 1
    b_idx, t_idx = is_copy[:, 2:].nonzero(as_tuple=True)
    t_idx = t_idx + 2  # content position of the copied token
    q = t_idx - 1 + n_prefix  # the query that predicts it
    src = t_idx - 2 + n_prefix  # the token it copies
    rest = ~is_copy
    rest[:, :4] = False
    rb, rt = rest[:, : x.shape[1] - 1].nonzero(as_tuple=True)
    rq = (rt - 1 + n_prefix).clamp(min=0)
    active_rows, dormant_rows = [], []
    for w in out.attentions:
        w = w.cpu()
        active = w[b_idx, :, q, src].mean(0)  # [H]
        if run.model.config.sink_logit != "none":
            dormant = (1 - w[rb, :, rq].sum(-1)).mean(0)
        else:
            dormant = w[rb, :, rq, 0].mean(0)
        active_rows.append(active)
        dormant_rows.append(dormant)
    active, dormant = torch.stack(active_rows), torch.stack(dormant_rows)
    best = divmod(int(active.argmax()), active.shape[1])
    return {"active": active, "dormant": dormant, "copy_head": best}


def variant_config(variant: str, preset: str = "fast", **overrides) -> TrainConfig:
    """The configuration the CLI and notebook 06 use for a variant and preset."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}; got {preset!r}")
    return replace(TrainConfig(variant=variant), **{**PRESETS[preset], **overrides})


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
# Gated attention's claim (Qiu et al. 2025): the gate removes most of the sink. Judged per seed on the gated model's
# attention on position 0 over the vanilla model's of the same seed: at most a half (fixed before any gated run).
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
    thresholds ``THRESHOLDS``, fixed before the run): the finding is reproduced when the whole range over the seeds
    is on the paper's side of the threshold (``paper``: whether the threshold holds for Table 3's numbers),
    not reproduced at this scale when the whole range is on the other side, and inconclusive at n = (the
    number of seeds) when the seeds fall on both sides (``course.claims.Rule``)."""
    kind = test.split("@")[0]
    if kind not in TABLE3_QUANTITIES:
        raise ValueError(f"test must be T1, T2@k or T3, got {test!r}")
    limit = THRESHOLDS[kind]
    holds_above = kind != "T2"            # T1 and T3 hold at or above their threshold, T2 at or below
    side = "at_least" if holds_above == bool(paper) else "at_most"
    return Rule(f"{finding}: {TABLE3_QUANTITIES[kind]} (nats), range over seeds", **{side: limit},
                why=f"{kind} = {limit:g} nats, fixed before the run (docs/thresholds.md); the paper's Table 3 "
                    f"{'meets' if paper else 'misses'} it")


def agreement(ours: list[bool], paper: bool) -> float:
    """The share of seeds whose outcome (``ours``: whether a threshold held, per seed) is the paper's."""
    if not ours:
        raise ValueError("ours must hold one outcome per seed, got none")
    return sum(bool(o) == bool(paper) for o in ours) / len(ours)


def verdict(ours: list[bool], paper: bool | None) -> str:
    """Does a threshold's outcome in our seeds agree with the paper's? The verdict ``table3_rule`` gives the
    per-seed values: "reproduced" when every seed agrees, "not reproduced at this scale" when none does,
    "inconclusive at n = <seeds>" when the seeds disagree. ``paper`` None (the paper has no such model): in how
    many seeds it held."""
    if not ours:
        raise ValueError("ours must hold one outcome per seed, got none")
    if paper is None:
        return f"held in {sum(bool(o) for o in ours)}/{len(ours)} seeds (not in the paper)"
    share = agreement(ours, paper)
    return "reproduced" if share == 1 else "not reproduced at this scale" if share == 0 else \
        f"inconclusive at n = {len(ours)}"


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
    import os

    processes = min(jobs, runs)
    return processes, max(1, (os.cpu_count() or 1) // processes)


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
