"""What every course model shares: its config, its output, and how it makes and checks caches."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from course.headwise import HeadwiseCache, HeadwisePolicy
from course.kvcache import AttentionView, Chunks, KVCache, cache_bytes_per_token
from course.models.attend import attend, reference_active
from course.models.family import family
from course.policies import Policy

__all__ = ["ModelConfig", "ModelOutput", "Block", "CausalLM", "OutputGate", "output_gate", "attend_view",
           "merge_heads"]


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of a decoder. ``family`` names its ``course.models.family.Family``: "gpt2" or "llama"."""

    family: str
    vocab_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    d_model: int
    head_dim: int
    d_ff: int
    max_positions: int  # GPT-2: rows of the position table; Llama: the trained context
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0  # Llama only
    tie_embeddings: bool = True
    sink_logit: Literal["none", "learned", "zero"] = "none"  # a per-head logit of an empty slot
    qkv_bias: bool = False  # Llama only: biases on the query/key/value projections (as Qwen2)
    output_gate: Literal["none", "elementwise"] = "none"  # gated attention (``OutputGate``)
    name: str = "model"
    random_weights: bool = False  # an untrained model: the course checks mechanics on it, not claims

    def __post_init__(self) -> None:
        if self.sink_logit not in ("none", "learned", "zero"):
            raise ValueError(f"sink_logit must be 'none', 'learned' or 'zero', got {self.sink_logit!r}")
        if self.output_gate not in ("none", "elementwise"):
            raise ValueError(f"output_gate must be 'none' or 'elementwise', got {self.output_gate!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    # The rules that follow from the family, decided here and nowhere else.
    @property
    def reassigns_positions(self) -> bool:
        """Can a cached token be given a new position? Yes with RoPE (positions enter inside attention);
        no with GPT-2's learned positions (added to the input, so baked into every cached K/V)."""
        return family(self.family).reassigns_positions

    @property
    def max_stream_tokens(self) -> int | None:
        """The most tokens one stream may have: GPT-2 has no position beyond its table; a RoPE model has
        no hard limit (past ``max_positions`` it leaves its trained context, which is the lesson of notebook 03)."""
        return None if self.reassigns_positions else self.max_positions

    def check_tokens(self, n_tokens: int, what: str = "this run") -> int:
        """Refuse, before any work, a run that needs more positions than the model has; return n_tokens."""
        limit = self.max_stream_tokens
        if limit is not None and n_tokens > limit:
            raise ValueError(
                f"{what} needs {n_tokens} token positions but {self.name} has {limit} (learned positions "
                f"0..{limit - 1}): use at most {limit} tokens, or a RoPE model to go further"
            )
        return n_tokens

    def clip_tokens(self, n_tokens: int) -> int:
        """``n_tokens``, or the model's position limit if that is smaller (sizes in the notebooks)."""
        limit = self.max_stream_tokens
        return n_tokens if limit is None else min(n_tokens, limit)

    def cache_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes one token takes in this model's cache (``course.kvcache.cache_bytes_per_token``)."""
        return cache_bytes_per_token(self.n_layer, self.n_kv_head, self.head_dim, dtype_bytes)


@dataclass
class ModelOutput:
    """logits: [B, T, vocab]; attentions: per layer [B, H, T, S] when asked for, else None;
    key_positions: per layer [B, H_kv, S], the original position of each attended slot."""

    logits: Tensor
    attentions: list[Tensor] | None = None
    key_positions: list[Tensor] | None = None


def output_gate(y: Tensor, x: Tensor, proj: nn.Module) -> Tensor:
    """Gated attention (Qiu et al. 2025, arXiv 2505.06708, position G1, elementwise and head-specific):

        Y' = Y ⊙ σ(X W_θ + b)

    y: [B, T, H·d] the heads' outputs, merged, before the output projection W_O; x: [B, T, D] the layer's input
    after the pre-norm (the gate is computed from the query token); proj: the map D -> H·d (W_θ, b). Each of a
    head's d output dimensions gets its own gate in (0, 1): a head can output ~0 without resting on a sink."""
    return y * torch.sigmoid(proj(x))


class OutputGate(nn.Module):
    """The gate's parameters, W_θ [H·d, D] and b [H·d] (b = 0 at initialisation: every gate starts at 0.5)."""

    def __init__(self, d_model: int, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, width)
        nn.init.zeros_(self.proj.bias)

    def forward(self, y: Tensor, x: Tensor) -> Tensor:
        """y: [B, T, H·d], x: [B, T, D] -> [B, T, H·d] (``output_gate``)."""
        return output_gate(y, x, self.proj)


def attend_view(q: Tensor, keys: Tensor, view: AttentionView, cache: KVCache, layer_idx: int, want_weights: bool,
                sink_logit: Tensor | None, scale: float | None = None) -> tuple[Tensor, Tensor | None]:
    """Attention of the queries q [B, H, T, d] over the slots a cache handed back (``view``, with ``keys``
    [B, H_kv, S, d] as the family placed them), reported to the cache (H2O and SnapKV read the weights they asked
    for). Returns (output [B, H, T, d], weights [B, H, rows, S] when ``want_weights``, else None)."""
    y, w = attend(q, keys, view.values, view.mask, scale=scale, weight_rows=view.rows(want_weights),
                  sink_logit=sink_logit)
    cache.observe(layer_idx, w)
    return y, w if want_weights else None


def merge_heads(y: Tensor, x: Tensor, gate: OutputGate | None, out: nn.Module,
                head_mask: Tensor | None = None) -> Tensor:
    """The heads' outputs y [B, H, T, d] merged to [B, T, H·d], gated from the layer's input x [B, T, D] when the
    model has an output gate, then projected by W_O (``out``) to [B, T, D]. ``head_mask`` (bool [H], the attention
    module's ``head_mask``, set by ``course.heads.masked_heads``): the heads marked True output zeros, so W_O
    receives nothing from them (an ablation; None, the usual case, costs nothing)."""
    if head_mask is not None:
        y = y.masked_fill(head_mask.to(y.device).view(1, -1, 1, 1), 0.0)
    b, h, t, d = y.shape
    y = y.transpose(1, 2).reshape(b, t, h * d)
    if gate is not None:
        y = gate(y, x)  # Y' = Y ⊙ σ(X W_θ + b), before W_O
    return out(y)


class Block(nn.Module):
    """A pre-norm residual block:  a = x + Attn(norm1(x));  out = a + MLP(norm2(a))."""

    def __init__(self, norm1: nn.Module, attn: nn.Module, norm2: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = norm1, attn, norm2, mlp

    def forward(self, x: Tensor, pos: Tensor, cache: KVCache | None, want_weights: bool):
        a, w, k_pos = self.attn(self.norm1(x), pos, cache, want_weights)
        x = x + a
        return x + self.mlp(self.norm2(x)), w, k_pos


class CausalLM(nn.Module):
    """Base class: position handling and cache creation common to GPT-2 and Llama."""

    config: ModelConfig

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def new_cache(self, batch: int = 1, policy: Policy | None = None, chunks: Chunks = "prompt",
                  max_tokens: int | None = None, rotated: bool | None = None) -> KVCache | HeadwiseCache:
        """An empty cache shaped for this model, managed by ``policy`` (default: keep everything).

        ``chunks``: what a forward of several tokens means, ``"prompt"`` (full attention, then
        ``compress``) or ``"stream"`` (the exact evaluator); see ``KVCache``. ``max_tokens``: the most
        tokens that will be fed (sizes the first allocation exactly).
        ``rotated`` (RoPE models): cache keys already rotated at their original positions, the fast path, where
        only the keys the policy moves are rotated again (``KVCache``'s ``rope_theta``), instead of before
        rotation, the readable path, where the model rotates every cached key at every step. The two give the same
        scores (tests/test_models.py). Default: rotated, except for ``chunks="stream"``, for a policy with a quantized
        store (its keys are then rounded before rotation; ``rotated=True`` rounds them rotated, as transformers'
        caches do) and for caches made inside ``course.models.attend.reference_mode()``."""
        if policy is not None:
            policy.check_model(self.config)
        c = self.config
        if rotated is None:  # a quantized store rounds keys before rotation (course.quantize)
            rotated = chunks == "prompt" and not reference_active() and getattr(policy, "quantizer", None) is None
        theta = c.rope_theta if rotated and c.reassigns_positions else None
        if isinstance(policy, HeadwisePolicy):
            return HeadwiseCache(policy, batch, c.head_dim, dtype=self.dtype, device=self.device, chunks=chunks,
                                 max_tokens=max_tokens, rope_theta=theta)
        return KVCache(c.n_layer, batch, c.n_kv_head, c.head_dim, policy=policy, dtype=self.dtype, device=self.device,
                       chunks=chunks, max_tokens=max_tokens, rope_theta=theta)

    @property
    def cache_bytes_per_token(self) -> int:
        """Bytes one token takes in this model's cache, at the model's dtype."""
        return self.config.cache_bytes_per_token(torch.finfo(self.dtype).bits // 8)

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> CausalLM:
        """GPT-2's initialisation (Radford et al. 2019): N(0, 0.02) for every matrix, the residual output
        projections scaled by 1/sqrt(2 L); vectors (norms, biases) keep their defaults. With ``seed``, the
        global generator is left as it was."""
        with torch.random.fork_rng(enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    residual_out = name.endswith(("attn.o.weight", "mlp.down.weight", "attn.out.weight",
                                                  "mlp.proj.weight"))
                    std = 0.02 / math.sqrt(2 * self.config.n_layer) if residual_out else 0.02
                    torch.nn.init.normal_(p, 0.0, std)
        return self

    def _inputs(self, ids: Tensor, positions: Tensor | None, cache: KVCache | None) -> tuple[Tensor, int]:
        """Check ids/cache; return positions as [B, T] long and the largest position."""
        if ids.dim() != 2:
            raise ValueError(f"ids must be [batch, tokens], got shape {tuple(ids.shape)}")
        if ids.shape[1] == 0:
            raise ValueError("ids is empty: give at least one token")
        b, t = ids.shape
        if cache is not None:
            if any(getattr(block.attn, "plain_attention", None) is not None for block in self.blocks):
                raise ValueError("gated heads (course.heads.gated_heads) act on forwards without a cache only: "
                                 "call the model without cache= inside gated_heads")
            c = self.config
            if cache.shape != (c.n_layer, b, c.n_kv_head, c.head_dim):
                raise ValueError(
                    f"cache shape (layers, batch, kv_heads, head_dim) = {cache.shape} does not fit this "
                    f"model and batch: expected {(c.n_layer, b, c.n_kv_head, c.head_dim)}; "
                    "make it with model.new_cache(batch)"
                )
            if cache.dtype != self.dtype:
                raise ValueError(f"cache dtype {cache.dtype} does not match the model's {self.dtype}: "
                                 "make the cache with model.new_cache(batch) after model.to(dtype)")
            if cache.rope_theta is not None and (not c.reassigns_positions or cache.rope_theta != c.rope_theta):
                raise ValueError(f"this cache takes keys rotated with RoPE base {cache.rope_theta}, which "
                                 f"{c.name} does not give: make the cache with model.new_cache(batch)")
        if positions is None:  # the usual case: no host-device synchronisation needed
            start = cache.seen if cache is not None else 0
            return torch.arange(start, start + t, device=ids.device).expand(b, t), start + t - 1
        positions = positions.to(ids.device).long()
        if positions.dim() == 1:
            positions = positions.expand(b, t)
        if positions.shape != (b, t):
            raise ValueError(f"positions must be [tokens] or [batch, tokens] = {(b, t)}, got {tuple(positions.shape)}")
        if int(positions.min()) < 0:
            raise ValueError("positions must be >= 0")
        return positions, int(positions.max())

    def forward(
        self,
        ids: Tensor,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        output_attentions: bool = False,
        logits_to_keep: int = 0,
    ) -> ModelOutput:
        """ids: [B, T] token ids; positions: [T] or [B, T] (default: continue the cache's stream).

        With a cache, the new tokens' K/V are stored and they attend to everything the cache
        holds (by its policy). Returns logits [B, T, vocab] (and attention weights on request).
        ``logits_to_keep`` (transformers' argument of that name): only the last that many positions'
        logits, [B, min(T, n), vocab]; 0 keeps all. A forward that only picks the next token needs 1,
        and skips the output matrix (a fifth of SmolLM2's weights) on every other position.
        Each family defines ``embed`` (how tokens and positions enter) and ``final_norm``.
        """
        if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be an integer >= 0 (0: every position), got {logits_to_keep!r}")
        pos, max_pos = self._inputs(ids, positions, cache)
        x = self.embed(ids, pos, max_pos)
        x, attentions, key_positions = self._run_blocks(x, pos, cache, output_attentions)
        x = x[:, -logits_to_keep:] if logits_to_keep else x
        return ModelOutput(self.lm_head(self.final_norm(x)), attentions, key_positions)

    def embed(self, ids: Tensor, pos: Tensor, max_pos: int) -> Tensor:
        raise NotImplementedError

    def final_norm(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def value_outputs(self) -> list[tuple[nn.Module, slice]]:
        """Per layer, the module whose output holds the values, and the slice of its last dim that does."""
        raise NotImplementedError

    def _run_blocks(
        self, x: Tensor, pos: Tensor, cache: KVCache | None, output_attentions: bool
    ) -> tuple[Tensor, list[Tensor] | None, list[Tensor] | None]:
        """Run every block; then the cache has seen the new tokens. Returns x [B, T, D] and,
        when ``output_attentions``, per-layer weights and the key positions they refer to."""
        attentions, key_positions = [], []
        for block in self.blocks:
            x, w, k_pos = block(x, pos, cache, output_attentions)
            if output_attentions:
                attentions.append(w)
                key_positions.append(k_pos.clone())
        if cache is not None:
            cache.advance(x.shape[1])
        return x, (attentions or None), (key_positions or None)
