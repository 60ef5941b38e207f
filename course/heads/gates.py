"""DuoAttention's gates: learn which KV heads need the whole cache (Xiao et al. 2024, arXiv 2410.10819, Sec. 3).

Every KV head gets a gate α in [0, 1] that mixes two attentions of its query heads over the same keys:

    attn = α · full_attention + (1 - α) · streaming_attention

where streaming attention sees only the first ``sinks`` tokens and the last ``window`` (a Λ-shaped causal mask).
The model's weights stay frozen; the gates start at 1 and are trained on synthetic passkey prompts so that the
final hidden states at the answer positions stay those of the full model, with an L1 penalty pulling every gate
towards 0 (streaming):  loss = Σ_answer positions ||h_full − h_gated||² + l1 · Σ α. The heads whose gates stay
high are the retrieval heads; the others can keep sinks + window.

    gates = optimize_gates(model, trials, steps=100, lr=0.02, l1=0.05)   # [layers, kv heads] in [0, 1]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from course.evaluate import NeedleTrial
from course.models.attend import attend
from course.models.base import CausalLM
from course.progress import progress_bar

__all__ = ["streaming_mask", "gated_attention", "gated_heads", "optimize_gates"]


def streaming_mask(t: int, sinks: int, window: int, device=None) -> Tensor:
    """bool [T, T], True where query i may see key j: causal, and j < ``sinks`` or i - j < ``window``."""
    if sinks < 0 or window < 1:
        raise ValueError(f"sinks must be >= 0 and window >= 1, got sinks={sinks}, window={window}")
    i = torch.arange(t, device=device)[:, None]
    j = torch.arange(t, device=device)[None, :]
    return (j <= i) & ((j < sinks) | (i - j < window))


def gated_attention(gates: Tensor, sinks: int, window: int) -> Callable:
    """An ``attend`` for the plain causal path whose KV head k outputs gates[k] · full + (1 - gates[k]) · streaming
    (``gates``: [H_kv], each KV head's query heads share its gate). Weights are not returned."""

    def attend_gated(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, weight_rows: int = 0,
                     sink_logit: Tensor | None = None) -> tuple[Tensor, None]:
        if weight_rows:
            raise ValueError("gated attention returns no weights: run without output_attentions")
        t = q.shape[2]
        full, _ = attend(q, k, v, causal=causal, sink_logit=sink_logit)
        stream, _ = attend(q, k, v, streaming_mask(t, sinks, window, q.device)[None, None], sink_logit=sink_logit)
        alpha = gates.to(q.dtype).repeat_interleave(q.shape[1] // k.shape[1]).view(1, -1, 1, 1)  # per query head
        return alpha * full + (1 - alpha) * stream, None

    return attend_gated


@contextmanager
def gated_heads(model: CausalLM, gates: Tensor, sinks: int = 4, window: int = 64) -> Iterator[CausalLM]:
    """Inside, plain forwards (no cache) mix full and streaming attention per KV head by ``gates`` [layers, H_kv]
    (``gated_attention``); on leaving, every layer attends as before."""
    c = model.config
    if tuple(gates.shape) != (c.n_layer, c.n_kv_head):
        raise ValueError(f"gates must be [layers, kv heads] = {(c.n_layer, c.n_kv_head)} for {c.name}, "
                         f"got {tuple(gates.shape)}")
    attns = [block.attn for block in model.blocks]
    try:
        for attn, row in zip(attns, gates):
            attn.plain_attention = gated_attention(row, sinks, window)
        yield model
    finally:
        for attn in attns:
            attn.plain_attention = None


def _final_states(model: CausalLM, ids: Tensor, rows: int) -> Tensor:
    """The final hidden states (what the output matrix reads) of the last ``rows`` positions: [B, rows, D]."""
    seen: list[Tensor] = []
    hook = model.lm_head.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        model(ids, logits_to_keep=rows)
    finally:
        hook.remove()
    return seen[0]


def _teacher(model: CausalLM, trial: NeedleTrial) -> tuple[Tensor, Tensor, int]:
    """A trial's ids (prompt + answer but its last token), the full model's final states at the A positions that
    predict the answer, and A."""
    ids = torch.cat([trial.prompt[0], trial.answer[:-1]])[None].to(model.device)
    rows = trial.answer.shape[0]
    with torch.no_grad():
        return ids, _final_states(model, ids, rows), rows


def optimize_gates(model: CausalLM, trials: list[NeedleTrial], steps: int = 100, lr: float = 0.02, l1: float = 0.05,
                   sinks: int = 4, window: int = 64, progress: bool = False) -> Tensor:
    """DuoAttention's gates [layers, H_kv] in [0, 1], trained for ``steps`` Adam steps (one trial per step, in turn)
    with learning rate ``lr`` to keep the full model's final hidden states at the answer positions (sum of squared
    differences) under an L1 penalty ``l1`` · Σ gates; clipped to [0, 1] after every step. The model is unchanged."""
    if not trials:
        raise ValueError("trials is empty: make some with course.evaluate.make_needle_trials")
    if steps < 1 or lr <= 0 or l1 < 0:
        raise ValueError(f"steps must be >= 1, lr > 0 and l1 >= 0, got steps={steps}, lr={lr}, l1={l1}")
    c = model.config
    teachers = [_teacher(model, t) for t in trials]
    gates = torch.ones(c.n_layer, c.n_kv_head, device=model.device, requires_grad=True)
    opt = torch.optim.Adam([gates], lr=lr)
    frozen = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)
    try:
        for step in progress_bar(range(steps), desc="gates", enabled=progress):
            ids, target, rows = teachers[step % len(teachers)]
            with gated_heads(model, gates, sinks, window):
                states = _final_states(model, ids, rows)
            loss = (states.float() - target.float()).pow(2).sum() + l1 * gates.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                gates.clamp_(0.0, 1.0)
    finally:
        for p, flag in zip(model.parameters(), frozen):
            p.requires_grad_(flag)
    return gates.detach().cpu()
