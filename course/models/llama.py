"""A Llama-family decoder (Llama 2/3, SmolLM2, ...), readable top to bottom, with an explicit KV cache.

    x_0   = E[token]                                    (no position at the input)
    a_l   = x_l + Attn(RMSNorm_1(x_l))                  (positions enter inside attention, RoPE)
    x_l+1 = a_l + W_down (silu(W_gate x) * W_up x)      (SwiGLU MLP on RMSNorm_2(a_l))
    logits = RMSNorm_f(x_L) W_out

RoPE (Su et al. 2021) rotates each query and key by an angle proportional to its position,
so the score q_i . k_j depends only on the distance i - j. Keys are cached *before* rotation
and rotated at every step with the positions the cache's policy chooses: their original
positions, or their slots 0..n-1 inside the cache (StreamingLLM). That is the readable path,
and the reference. The fast path gives the same scores with less work: keys are cached rotated
at their original positions (as transformers caches them), the query is rotated at its own, and
the cache rotates again only the keys whose distance to the query its policy changes (the
sinks, under StreamingLLM: ``course.kvcache.KVCache._place``). ``model.new_cache`` picks the
fast path unless told otherwise (``rotated=False``, or inside ``reference_mode()``).
Grouped-query attention (GQA): H query heads share H_kv key/value heads.

Shapes: B batch, T new tokens, S cached slots, D model width, H / H_kv heads, d head width.
"""

from __future__ import annotations


from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from course.kvcache import KVCache, SinkRotation
from course.rope import rope, rope_tables
from course.models.attend import attend
from course.models.base import Block, CausalLM, ModelConfig, OutputGate, attend_view, merge_heads
from course.models.family import Family, register

__all__ = ["Llama", "RMSNorm", "rope", "rope_tables", "rope_theta", "config_from_hf", "weights_from_hf"]


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g   (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))  # at least float32 (as transformers); float64 stays
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * wide.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        d, h, hkv = cfg.head_dim, cfg.n_head, cfg.n_kv_head
        self.q = nn.Linear(cfg.d_model, h * d, bias=cfg.qkv_bias)
        self.k = nn.Linear(cfg.d_model, hkv * d, bias=cfg.qkv_bias)
        self.v = nn.Linear(cfg.d_model, hkv * d, bias=cfg.qkv_bias)
        self.o = nn.Linear(h * d, cfg.d_model, bias=False)
        # An optional per-head logit of an empty slot: attention can go "nowhere" (sink-logit
        # models learn it; "zero" fixes it at 0, i.e. softmax-off-by-one).
        self.sink_logit = nn.Parameter(torch.zeros(h), requires_grad=cfg.sink_logit == "learned") \
            if cfg.sink_logit != "none" else None
        # Gated attention (optional): a sigmoid gate per output dimension, computed from x (``OutputGate``).
        self.gate = OutputGate(cfg.d_model, h * d) if cfg.output_gate == "elementwise" else None
        self.head_mask: Tensor | None = None  # bool [H]: heads whose output is zeroed before W_O (``merge_heads``)
        self.plain_attention: Callable | None = None  # stands in for ``attend`` on the plain path (course.heads.gates)

    def forward(
        self, x: Tensor, pos: Tensor, cache: KVCache | None, want_weights: bool
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """x: [B, T, D] -> ([B, T, D], weights [B, H, T, S] or None, key positions [B, H_kv, S])."""
        b, t, _ = x.shape
        h, hkv, d, theta = self.cfg.n_head, self.cfg.n_kv_head, self.cfg.head_dim, self.cfg.rope_theta
        q = self.q(x).view(b, t, h, d).transpose(1, 2)  # [B, H, T, d]
        k = self.k(x).view(b, t, hkv, d).transpose(1, 2)  # [B, H_kv, T, d], not rotated
        v = self.v(x).view(b, t, hkv, d).transpose(1, 2)

        if cache is None:  # a plain forward over the whole sequence: causal attention
            k_pos = pos[:, None, :].expand(b, hkv, t)
            q, k = rope(q, pos, theta), rope(k, pos, theta)
            plain = self.plain_attention or attend
            y, w = plain(q, k, v, causal=t > 1, weight_rows=t if want_weights else 0, sink_logit=self.sink_logit)
        else:
            if cache.rope_theta is None:
                # The readable path: the cache hands back every slot, not rotated, with the positions its policy's
                # rule gives them, and every key is rotated here, at every step.
                view = cache.update(self.layer_idx, k, v, pos)
                qr, kr, scale = rope(q, view.q_rope, theta), rope(view.keys, view.k_rope, theta), None
                if view.sink_rotation is not None:  # a stream chunk of the exact evaluator
                    qr, kr, scale = _sink_block_rotation(q, qr, kr, view.sink_rotation, theta)
            else:
                # The fast path, the same scores: keys are cached rotated at their original positions and the query
                # is rotated at its own (``cache.rotate`` is ``rope``, its tables computed once per forward); the
                # cache keeps each key where the policy puts it relative to such a query, rotating again only the
                # keys it moves.
                view = cache.update(self.layer_idx, cache.rotate(k, pos), v, pos)
                qr, kr, scale = cache.rotate(q, pos), view.keys, None
            k_pos = view.positions
            y, w = attend_view(qr, kr, view, cache, self.layer_idx, want_weights, self.sink_logit, scale)
        return merge_heads(y, x, self.gate, self.o, self.head_mask), w, k_pos


def _sink_block_rotation(
    q: Tensor, q_rot: Tensor, k_rot: Tensor, sinks: SinkRotation, theta: float
) -> tuple[Tensor, Tensor, float]:
    """Score pinned sinks with queries rotated to ``sinks.query_positions``, others as usual.

    Concatenating along the head dimension does it in one attention call:
        q' = [rope(q, p_sink) | rope(q, p)],   k' = [k_rot | 0] for sinks, [0 | k_rot] otherwise,
    so q'.k' is the sink score for sink keys and the usual score for the rest.
    """
    d = q.shape[-1]
    q_sink = rope(q, sinks.query_positions, theta)
    zeros = torch.zeros_like(k_rot)
    pinned = sinks.pinned[..., None]
    k2 = torch.cat([torch.where(pinned, k_rot, zeros), torch.where(pinned, zeros, k_rot)], dim=-1)
    return torch.cat([q_sink, q_rot], dim=-1), k2, d**-0.5


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))  # SwiGLU (Shazeer 2020)


class Llama(CausalLM):
    """A Llama-family decoder (RoPE, GQA, RMSNorm, SwiGLU). ``forward(ids, positions, cache)``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.family != "llama" or cfg.n_head % cfg.n_kv_head:
            raise ValueError("Llama needs family='llama' and n_head divisible by n_kv_head")
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(
            Block(RMSNorm(cfg.d_model, cfg.norm_eps), Attention(cfg, i), RMSNorm(cfg.d_model, cfg.norm_eps), MLP(cfg))
            for i in range(cfg.n_layer)
        )
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def embed(self, ids: Tensor, pos: Tensor, max_pos: int) -> Tensor:
        """x_0 = E[token]: [B, T] -> [B, T, D]. Positions enter later, inside attention (RoPE)."""
        return self.tok_emb(ids)

    def final_norm(self, x: Tensor) -> Tensor:
        return self.norm(x)

    def value_outputs(self) -> list[tuple[nn.Module, slice]]:
        """Per layer, the module whose output holds the values and where: the value projection, all of it."""
        return [(b.attn.v, slice(None)) for b in self.blocks]


def rope_theta(hf_config) -> float:
    """RoPE's base; refuses the RoPE scaling variants the course does not implement, by name."""
    rope = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"RoPE scaling {kind!r} is not implemented by the course's Llama (only plain RoPE, "
                         "rope_type 'default'); pick a checkpoint without rope scaling")
    return float(rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def config_from_hf(hf_config, name: str = "model") -> ModelConfig:
    """A transformers Llama, Mistral or Qwen2 config as a course config. Refuses, with the reason, what the
    course's Llama does not implement: RoPE scaling, attention or MLP biases beyond Qwen2's query/key/value biases,
    and sliding-window attention layers."""
    mt = hf_config.model_type
    theta = rope_theta(hf_config)
    if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
        raise ValueError(f"{mt} with attention_bias/mlp_bias is not implemented: the course's Llama has "
                         "no biases in attention or MLP (only Qwen2's query/key/value biases)")
    window = getattr(hf_config, "sliding_window", None)
    if mt == "qwen2" and not getattr(hf_config, "use_sliding_window", False):
        window = None
    if window is not None and window < hf_config.max_position_embeddings:
        raise ValueError(f"{mt} with sliding_window={window} is not implemented: the course's Llama attends "
                         "to its whole cache (its policies decide what it holds)")
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return ModelConfig(
        family="llama", vocab_size=hf_config.vocab_size, n_layer=hf_config.num_hidden_layers, n_head=heads,
        n_kv_head=hf_config.num_key_value_heads, d_model=hf_config.hidden_size, head_dim=head_dim,
        d_ff=hf_config.intermediate_size, max_positions=hf_config.max_position_embeddings,
        norm_eps=hf_config.rms_norm_eps, rope_theta=theta, tie_embeddings=bool(hf_config.tie_word_embeddings),
        qkv_bias=mt == "qwen2", name=name,
    )


def weights_from_hf(sd: dict, cfg: ModelConfig) -> dict:
    """Map a LlamaForCausalLM state dict to course names (nn.Linear on both sides: no transpose)."""
    out = {"tok_emb.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(cfg.n_layer):
        src, dst = f"model.layers.{i}.", f"blocks.{i}."
        pairs = {"input_layernorm": "norm1", "post_attention_layernorm": "norm2", "self_attn.q_proj": "attn.q",
                 "self_attn.k_proj": "attn.k", "self_attn.v_proj": "attn.v", "self_attn.o_proj": "attn.o",
                 "mlp.gate_proj": "mlp.gate", "mlp.up_proj": "mlp.up", "mlp.down_proj": "mlp.down"}
        for a, b in pairs.items():
            out[f"{dst}{b}.weight"] = sd[f"{src}{a}.weight"]
        if cfg.qkv_bias:
            for a, b in (("self_attn.q_proj", "attn.q"), ("self_attn.k_proj", "attn.k"), ("self_attn.v_proj", "attn.v")):
                out[f"{dst}{b}.bias"] = sd[f"{src}{a}.bias"]
    return out


register(Family("llama", Llama, ("llama", "mistral", "qwen2"), config_from_hf, weights_from_hf,
                reassigns_positions=True))
