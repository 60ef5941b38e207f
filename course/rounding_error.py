"""What rounding a key does to attention: the error in the attention logits, not only in the key (notebook 08).

A relative key error ||k' - k|| / ||k|| inflates small keys: a small key rounded with a coarse step has a large
relative error and may still move no attention. What the softmax sees is the logit q . k / sqrt(d); rounding the
key changes it by

    delta_ij = q_i . R(j) (k'_j - k_j) / sqrt(d)      (R(j): the rotary embedding at key j's position, if any),

and the weight of key j in query i's row changes by a factor of about exp(delta_ij) against the others. The course
reports, per key token, the mean |delta_ij| over the queries that see it (i >= j).
"""

from __future__ import annotations

import torch
from torch import Tensor

from course.models.base import CausalLM
from course.quantize import fake_quantize
from course.rope import rope

__all__ = ["queries", "logit_error_by_token"]


def _query_module(block) -> tuple[torch.nn.Module, int | None]:
    """The module whose output holds a block's queries, and how many of its outputs they are (None: all)."""
    if hasattr(block.attn, "q"):  # Llama: its own query projection
        return block.attn.q, None
    if hasattr(block.attn, "qkv"):  # GPT-2: W_Q, W_K, W_V side by side, the queries first
        return block.attn.qkv, block.attn.qkv.out_features // 3
    raise ValueError(f"cannot find the query projection of {type(block.attn).__name__} (expected .q or .qkv)")


@torch.inference_mode()
def queries(model: CausalLM, ids: Tensor) -> list[Tensor]:
    """Every layer's queries for ids [1, T], as attention uses them (rotated at their positions for a RoPE model):
    per layer [H, T, d], float32 on the CPU."""
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"ids must be one sequence, shape [1, T]; got {list(ids.shape)}")
    c = model.config
    found: list[Tensor] = []
    handles = []
    for block in model.blocks:
        module, width = _query_module(block)
        handles.append(module.register_forward_hook(
            lambda mod, inputs, out, width=width: found.append(out[..., :width] if width else out)))
    try:
        model(ids.to(model.device))
    finally:
        for handle in handles:
            handle.remove()
    t = ids.shape[1]
    out = []
    for q in found:
        q = q.float().cpu().view(1, t, c.n_head, c.head_dim).transpose(1, 2)  # [1, H, T, d]
        if c.family == "llama":
            q = rope(q, torch.arange(t)[None], c.rope_theta)
        out.append(q[0])
    return out


def logit_error_by_token(q: Tensor, keys: Tensor, bits: int, group: int, theta: float | None) -> Tensor:
    """Mean |q_i . R(j) (k'_j - k_j)| / sqrt(d) over the queries i >= j that see key j, where k' is KIVI's
    per-channel rounding of ``keys`` over consecutive groups of ``group`` tokens.

    q: [H, T, d] (rotated, as ``queries`` gives them); keys: [H_kv, T, d] as cached (before the rotary embedding
    when ``theta`` is given: the error is rotated to its key's position; already as attended when ``theta`` is
    None). H must be a multiple of H_kv (grouped-query attention). Returns [H_kv, T]: the mean over the query
    heads of each KV head."""
    h, t, d = q.shape
    h_kv = keys.shape[0]
    if h % h_kv or keys.shape[1:] != (t, d):
        raise ValueError(f"q [H, T, d] and keys [H_kv, T, d] must share T and d with H a multiple of H_kv; got "
                         f"{list(q.shape)} and {list(keys.shape)}")
    k = keys.float()
    rounded = torch.cat([fake_quantize(k[:, s : s + group], bits, dim=1) for s in range(0, t, group)], dim=1)
    delta = rounded - k  # [H_kv, T, d]
    if theta is not None:
        delta = rope(delta[None], torch.arange(t)[None], theta)[0]
    delta = delta.repeat_interleave(h // h_kv, dim=0)  # [H, T, d]: each query head's KV head
    logits = q.float() @ delta.transpose(1, 2) / d**0.5  # [H, T (queries), T (keys)]
    seen = torch.ones(t, t).tril()  # query i sees keys j <= i
    per_key = (logits.abs() * seen).sum(dim=1) / seen.sum(dim=0)  # [H, T]
    return per_key.view(h_kv, h // h_kv, t).mean(dim=1)
