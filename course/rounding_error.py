"""What rounding a key does to attention: the error in the attention logits, not only in the key (notebook 08).

A relative key error ||k' - k|| / ||k|| inflates small keys: a small key rounded with a coarse step has a large
relative error and may still move no attention. What the softmax sees is the logit q . k / sqrt(d); rounding the
key changes it by

    delta_ij = q_i . R(j) (k'_j - k_j) / sqrt(d)      (R(j): the rotary embedding at key j's position, if any),

and the weight of key j in query i's row changes by a factor of about exp(delta_ij) against the others. The course
reports, per key token, the mean |delta_ij| over the queries that see it (i >= j), and the mean change of its
attention weight, |w'_ij - w_ij|, which also counts how much weight the key carries.
"""

from __future__ import annotations

import torch
from torch import Tensor

from course.models.base import CausalLM
from course.storage.rounding import round_by_groups
from course.rope import rope

__all__ = ["queries", "logit_error_by_token", "weight_change_by_token"]


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


def _check_shapes(q: Tensor, keys: Tensor) -> None:
    h, t, d = q.shape
    if h % keys.shape[0] or keys.shape[1:] != (t, d):
        raise ValueError(f"q [H, T, d] and keys [H_kv, T, d] must share T and d with H a multiple of H_kv; got "
                         f"{list(q.shape)} and {list(keys.shape)}")


def _as_attended(keys: Tensor, theta: float | None, heads: int) -> Tensor:
    """keys [H_kv, T, d] as the queries meet them: rotated at their positions (``theta``, else as they are) and
    repeated for each query head of a KV head: [H, T, d]."""
    if theta is not None:
        keys = rope(keys[None], torch.arange(keys.shape[1])[None], theta)[0]
    return keys.repeat_interleave(heads // keys.shape[0], dim=0)


def _per_key(change: Tensor, h_kv: int) -> Tensor:
    """Mean over the queries i >= j that see key j of change [H, T queries, T keys], then over each KV head's
    query heads: [H_kv, T]."""
    h, t, _ = change.shape
    seen = torch.ones(t, t).tril()  # query i sees keys j <= i
    per_key = (change * seen).sum(dim=1) / seen.sum(dim=0)  # [H, T]
    return per_key.view(h_kv, h // h_kv, t).mean(dim=1)


def logit_error_by_token(q: Tensor, keys: Tensor, bits: int, group: int, theta: float | None) -> Tensor:
    """Mean |q_i . R(j) (k'_j - k_j)| / sqrt(d) over the queries i >= j that see key j, where k' is KIVI's
    per-channel rounding of ``keys`` over consecutive groups of ``group`` tokens.

    q: [H, T, d] (rotated, as ``queries`` gives them); keys: [H_kv, T, d] as cached (before the rotary embedding
    when ``theta`` is given: the error is rotated to its key's position; already as attended when ``theta`` is
    None). H must be a multiple of H_kv (grouped-query attention). Returns [H_kv, T]: the mean over the query
    heads of each KV head."""
    _check_shapes(q, keys)
    delta = _as_attended(round_by_groups(keys, bits, group) - keys.float(), theta, q.shape[0])  # [H, T, d]
    return _per_key((q.float() @ delta.transpose(1, 2)).abs() / q.shape[-1] ** 0.5, keys.shape[0])


def weight_change_by_token(q: Tensor, keys: Tensor, bits: int, group: int, theta: float | None) -> Tensor:
    """Mean |w'_ij - w_ij| over the queries i >= j that see key j: how much attention weight key j gains or loses
    when every key is rounded as in ``logit_error_by_token`` (w: the causal softmax of q . k / sqrt(d), no
    sink logit). Same arguments and shapes; returns [H_kv, T]."""
    _check_shapes(q, keys)
    h, t, d = q.shape
    future = torch.ones(t, t).triu(1).bool()

    def weights(k: Tensor) -> Tensor:
        logits = q.float() @ _as_attended(k, theta, h).transpose(1, 2) / d**0.5
        return torch.softmax(logits.masked_fill(future, -torch.inf), dim=-1)  # [H, T, T]

    return _per_key((weights(round_by_groups(keys, bits, group)) - weights(keys.float())).abs(), keys.shape[0])
