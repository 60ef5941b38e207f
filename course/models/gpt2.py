"""GPT-2 (Radford et al. 2019), readable top to bottom, with an explicit KV cache.

    x_0   = E[token] + P[position]                    (learned absolute positions, at the input)
    a_l   = x_l + Attn(LN_1(x_l))                     (pre-norm residual blocks)
    x_l+1 = a_l + MLP(LN_2(a_l)),   MLP(x) = W_2 gelu(W_1 x)
    logits = LN_f(x_L) E^T                            (output tied to the token embedding)

Because the position is *added to the input*, every key and value a layer computes already
carries its token's original position. A cached K/V can therefore never be moved to another
position without recomputing it, and positions >= ``max_positions`` (1024) do not exist:
this is why StreamingLLM's position re-assignment needs a RoPE model (see llama.py).

Shapes: B batch, T new tokens, S cached slots, D model width, H heads, d = D / H.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from course.kvcache import KVCache
from course.models.attend import attend
from course.models.base import Block, CausalLM, ModelConfig, OutputGate, attend_view, merge_heads
from course.models.family import Family, register

__all__ = ["GPT2", "config_from_hf", "weights_from_hf"]


def gelu_tanh(x: Tensor) -> Tensor:
    """GPT-2's GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)  # W_Q, W_K, W_V side by side
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        # An optional per-head logit of an empty slot (see llama.py); the pretrained GPT-2 has none.
        self.sink_logit = nn.Parameter(torch.zeros(cfg.n_head), requires_grad=cfg.sink_logit == "learned") \
            if cfg.sink_logit != "none" else None
        # Gated attention (optional): a sigmoid gate per output dimension, computed from x (``OutputGate``).
        self.gate = OutputGate(cfg.d_model, cfg.d_model) if cfg.output_gate == "elementwise" else None
        self.head_mask: Tensor | None = None  # bool [H]: heads whose output is zeroed before W_O (``merge_heads``)
        self.plain_attention: Callable | None = None  # stands in for ``attend`` on the plain path (course.heads.gates)

    def forward(
        self, x: Tensor, pos: Tensor, cache: KVCache | None, want_weights: bool
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """x: [B, T, D] -> ([B, T, D], weights [B, H, T, S] or None, key positions [B, H, S])."""
        b, t, _ = x.shape
        h, d = self.cfg.n_head, self.cfg.head_dim
        q, k, v = self.qkv(x).split(self.cfg.d_model, dim=-1)
        q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in (q, k, v))  # [B, H, T, d]

        if cache is None:  # a plain forward over the whole sequence: causal attention
            k_pos = pos[:, None, :].expand(b, h, t)
            plain = self.plain_attention or attend
            y, w = plain(q, k, v, causal=t > 1, weight_rows=t if want_weights else 0, sink_logit=self.sink_logit)
        else:  # the cache hands back every slot it holds, with the mask its policy implies
            view = cache.update(self.layer_idx, k, v, pos)  # positions are in the embeddings: no rotation
            k_pos = view.positions
            y, w = attend_view(q, view.keys, view, cache, self.layer_idx, want_weights, self.sink_logit)
        return merge_heads(y, x, self.gate, self.out, self.head_mask), w, k_pos


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.proj = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(gelu_tanh(self.fc(x)))


class GPT2(CausalLM):
    """GPT-2 with learned absolute positions. ``forward(ids, positions, cache)``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.family != "gpt2" or cfg.n_kv_head != cfg.n_head:
            raise ValueError("GPT2 needs family='gpt2' and n_kv_head == n_head")
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)  # E
        self.pos_emb = nn.Embedding(cfg.max_positions, cfg.d_model)  # P
        self.blocks = nn.ModuleList(
            Block(nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps), Attention(cfg, i),
                  nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps), MLP(cfg))
            for i in range(cfg.n_layer)
        )
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied

    def embed(self, ids: Tensor, pos: Tensor, max_pos: int) -> Tensor:
        """x_0 = E[token] + P[position]: [B, T] -> [B, T, D]. Positions beyond the table do not exist."""
        if max_pos >= self.config.max_positions:
            raise ValueError(
                f"position {max_pos} does not exist in GPT-2: its learned position table has "
                f"{self.config.max_positions} rows (0..{self.config.max_positions - 1}). Stream at most "
                f"{self.config.max_positions} tokens with GPT-2, or use a RoPE model to go further."
            )
        return self.tok_emb(ids) + self.pos_emb(pos)

    def final_norm(self, x: Tensor) -> Tensor:
        return self.ln_f(x)

    def value_outputs(self) -> list[tuple[nn.Module, slice]]:
        """Per layer, the module whose output holds the values and where: one projection for Q, K, V, the
        values its last third."""
        return [(b.attn.qkv, slice(2 * self.config.d_model, None)) for b in self.blocks]


def config_from_hf(hf_config, name: str = "model") -> ModelConfig:
    """A transformers GPT-2 config as a course config."""
    d = hf_config.n_embd
    return ModelConfig(
        family="gpt2", vocab_size=hf_config.vocab_size, n_layer=hf_config.n_layer, n_head=hf_config.n_head,
        n_kv_head=hf_config.n_head, d_model=d, head_dim=d // hf_config.n_head,
        d_ff=hf_config.n_inner or 4 * d, max_positions=hf_config.n_positions,
        norm_eps=hf_config.layer_norm_epsilon, tie_embeddings=True, name=name,
    )


def weights_from_hf(sd: dict, cfg: ModelConfig) -> dict:
    """Map a GPT2LMHeadModel state dict to course names (Conv1D weights are [in, out]: transpose)."""
    out = {"tok_emb.weight": sd["transformer.wte.weight"], "pos_emb.weight": sd["transformer.wpe.weight"],
           "ln_f.weight": sd["transformer.ln_f.weight"], "ln_f.bias": sd["transformer.ln_f.bias"]}
    for i in range(cfg.n_layer):
        src, dst = f"transformer.h.{i}.", f"blocks.{i}."
        for a, b in (("ln_1", "norm1"), ("ln_2", "norm2")):
            out[f"{dst}{b}.weight"], out[f"{dst}{b}.bias"] = sd[f"{src}{a}.weight"], sd[f"{src}{a}.bias"]
        for a, b in (("attn.c_attn", "attn.qkv"), ("attn.c_proj", "attn.out"), ("mlp.c_fc", "mlp.fc"),
                     ("mlp.c_proj", "mlp.proj")):
            out[f"{dst}{b}.weight"] = sd[f"{src}{a}.weight"].t()
            out[f"{dst}{b}.bias"] = sd[f"{src}{a}.bias"]
    return out


register(Family("gpt2", GPT2, ("gpt2",), config_from_hf, weights_from_hf, reassigns_positions=False))
