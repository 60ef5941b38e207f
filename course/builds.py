"""What the build exercises plug into: the course's model, run with a student's attention in place of its own.

* ``drive_layers(model, ids, step, *settings)`` runs the course's Llama token by token, calling ``step`` as every
  layer's attention (notebook 03's rolling cache, notebook 04's H2O decode loop);
* ``layer_parts(attn)`` is what a student's attention layer may use of a GPT-2-family attention module
  (notebook 06);
* ``best_voted(kept, votes, window)`` says whether kept slots are a best-voted set under given votes (notebook 05,
  where ties may be broken either way).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor

__all__ = ["drive_layers", "layer_parts", "best_voted"]


@torch.inference_mode()
def drive_layers(model, ids: Tensor, step, *settings) -> Tensor:
    """Run the course's Llama token by token with ``step`` as every layer's attention: logits [B, T, vocab].

    Everything but the attention is the model's own (embedding, norms, projections, MLP); ``step`` gets
    ``(state, q, k, v, t, *settings, theta)``: the layer's state (what ``step`` returned for token t - 1, None at
    first), the un-rotated q [B, H, 1, d], k, v [B, H_kv, 1, d] of token ``t``, the cache's ``settings`` (03:
    n_sink, window; 04: budget, recent) and the RoPE base; it returns (the heads' output [B, H, 1, d], the new
    state). ``ValueError`` when it returns something else."""
    cfg = model.config
    b, h, hkv, d = ids.shape[0], cfg.n_head, cfg.n_kv_head, cfg.head_dim
    states, rows = [None] * cfg.n_layer, []
    for t in range(ids.shape[1]):
        x = model.tok_emb(ids[:, t : t + 1])
        for i, block in enumerate(model.blocks):
            a, z = block.attn, block.norm1(x)
            q = a.q(z).view(b, 1, h, d).transpose(1, 2)
            k, v = (m(z).view(b, 1, hkv, d).transpose(1, 2) for m in (a.k, a.v))
            out = step(states[i], q, k, v, t, *settings, cfg.rope_theta)
            if not isinstance(out, tuple) or len(out) != 2:
                raise ValueError("return a tuple (output [B, H, 1, d], state)")
            y, states[i] = torch.as_tensor(out[0]), out[1]
            if tuple(y.shape) != (b, h, 1, d):
                raise ValueError(f"the output must be [B, H, 1, d] = {(b, h, 1, d)} (one row per query head), "
                                 f"got {tuple(y.shape)}")
            x = x + a.o(y.to(x.dtype).transpose(1, 2).reshape(b, 1, h * d))
            x = x + block.mlp(block.norm2(x))
        rows.append(model.lm_head(model.norm(x)))
    return torch.cat(rows, dim=1)


def layer_parts(attn) -> SimpleNamespace:
    """What a student's layer may use of a GPT-2-family attention module ``attn`` (course.models.gpt2):
    ``qkv`` (nn.Linear D -> 3D, W_Q, W_K, W_V side by side), ``out`` (nn.Linear D -> D), ``sink_logit`` [H] (None
    without one), ``gate`` (nn.Linear D -> D, the output gate's W_θ and b; None without one) and ``n_head``; not the
    module's own forward."""
    gate = attn.gate.proj if attn.gate is not None else None
    return SimpleNamespace(qkv=attn.qkv, out=attn.out, sink_logit=attn.sink_logit, gate=gate, n_head=attn.cfg.n_head)


def best_voted(kept: Tensor, votes: Tensor, window: int) -> bool:
    """Is every row of ``kept`` ([..., C] positions) the last ``window`` positions plus a best-voted set of the
    others under ``votes`` ([..., P], the same leading shape; ties in any order)?"""
    p = votes.shape[-1]
    for row, v in zip(kept.reshape(-1, kept.shape[-1]), votes.reshape(-1, p).double()):
        mask = torch.zeros(p, dtype=torch.bool)
        mask[row] = True
        if not bool(mask[p - window :].all()) or int(mask.sum()) != len(row):
            return False
        prefix_kept, prefix_left = v[: p - window][mask[: p - window]], v[: p - window][~mask[: p - window]]
        if len(prefix_left) and float(prefix_kept.min()) < float(prefix_left.max()) - 1e-5:
            return False
    return True
