"""What determines a training run: the five model variants, the configuration whose hash names a run, the
presets, the model a configuration builds, and a trained run.

* ``vanilla``: sequences start directly with content;
* ``sink-token``: a dedicated learnable start token is prepended to every sample (StreamingLLM
  section 3.3's [SINK]); it is input only, never a prediction target;
* ``sink-logit``: no start token, but every head has a learned logit for an empty slot that takes
  part in the softmax (attention can go "nowhere");
* ``off-by-one``: that logit fixed at 0, i.e. softmax with 1 added to its denominator;
* ``gated``: gated attention (Qiu et al. 2025, arXiv 2505.06708): a sigmoid gate, computed from the query
  token, on every output dimension of every head, before the output projection
  (``course.models.base.output_gate``), so that a head can output ~0 without a place to rest.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from torch import Tensor

from course.model_names import VARIANTS
from course.models.base import CausalLM, ModelConfig
from course.splits import GENERATOR_SEED_MAX
from course.training.tasks import TEXT_DATA, prepend_sink

__all__ = ["Variant", "TrainConfig", "PRESETS", "MIN_SEEDS", "VARIANTS", "model_config", "variant_config", "TrainRun"]

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
        if not 0 <= self.seed <= GENERATOR_SEED_MAX:  # a split's seed (course.splits), e.g. a fresh draw's
            raise ValueError(f"seed must be an integer from 0 to {GENERATOR_SEED_MAX}, got {self.seed}")
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
        if self.task == "text":  # text runs trained on every character are not loaded as the split's
            fields["text_data"] = TEXT_DATA
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


def model_config(cfg: TrainConfig, vocab: int) -> ModelConfig:
    """The model of a run: ``vocab`` content tokens, then the sink token's id, then (with ``bos``) the BOS id."""
    sink_logit = {"sink-logit": "learned", "off-by-one": "zero"}.get(cfg.variant, "none")
    return ModelConfig(
        family=cfg.family, vocab_size=vocab + 1 + int(cfg.bos), n_layer=cfg.n_layer, n_head=cfg.n_head,
        n_kv_head=cfg.n_head, d_model=cfg.d_model, head_dim=cfg.d_model // cfg.n_head, d_ff=cfg.d_ff,
        max_positions=4 * (cfg.seq_len + 1 + int(cfg.bos)), rope_theta=10000.0, tie_embeddings=True,
        sink_logit=sink_logit, qkv_bias=cfg.qkv_bias, name=f"tiny-{cfg.variant}",
        output_gate="elementwise" if cfg.variant == "gated" else "none",
    )


def variant_config(variant: str, preset: str = "fast", **overrides) -> TrainConfig:
    """The configuration the CLI and notebook 06 use for a variant and preset."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}; got {preset!r}")
    return replace(TrainConfig(variant=variant), **{**PRESETS[preset], **overrides})


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
