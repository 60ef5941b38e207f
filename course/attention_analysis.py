"""Where does attention go? Sink mass per layer and head, the heads that are sinks, and why.

The mass functions take the per-layer attention weights a model returns with
``output_attentions=True``: a list (one per layer) of [B, H, T, S] tensors, rows = queries.

Why a sink: ``residual_norms`` (the first token's hidden state grows far larger than the others in the
middle layers: the *massive activations* of Sun et al. 2024), ``value_norms`` (its value vectors are
small: what attention collects from it is close to nothing, the *value-state drain* of Guo et al. 2024)
and ``first_token_ablation``, the causal test that separates the two roles of the first token: zeroing
its value (what it says) vs hiding its key from the softmax (where attention can rest).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import Tensor

from course.models.base import CausalLM
from course.policies import Policy

__all__ = ["attention_maps", "sink_mass", "key_mass", "punctuation_keys", "sink_heads_share", "top_k_mass",
           "uniform_mass", "sink_kept", "residual_norms", "activation_peaks", "value_norms", "first_token_ablation",
           "gate_openness"]


@torch.inference_mode()
def attention_maps(model: CausalLM, ids: Tensor) -> list[Tensor]:
    """Attention weights of every layer for a plain forward: list of [B, H, T, T] (CPU, float32)."""
    if ids.dim() == 1:
        ids = ids[None]
    model.config.check_tokens(ids.shape[1], "attention_maps")
    out = model(ids.to(model.device), output_attentions=True)
    return [w.float().cpu() for w in out.attentions]


def sink_mass(maps: list[Tensor], k: int = 1, skip: int | None = None) -> Tensor:
    """Mean attention mass on the first ``k`` keys: [layers, heads].

    Queries before position ``skip`` (default: 4 * k) are left out: a query at position < k can
    only attend to the first tokens, which would inflate the mass for a trivial reason.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    skip = 4 * k if skip is None else skip
    t = maps[0].shape[-2]
    if skip >= t:
        raise ValueError(f"skip={skip} leaves no query in a sequence of {t} tokens")
    return torch.stack([w[:, :, skip:, :k].sum(-1).mean(dim=(0, 2)) for w in maps])


def key_mass(maps: list[Tensor], keys: Tensor, skip: int = 4) -> Tensor:
    """Mean attention mass on the keys marked in ``keys`` (bool [T], or [B, T] per row): [layers, heads].

    Queries before position ``skip`` are left out (as in ``sink_mass``)."""
    t = maps[0].shape[-1]
    if keys.shape[-1] != t:
        raise ValueError(f"keys must mark each of the {t} keys, got shape {tuple(keys.shape)}")
    if skip >= t:
        raise ValueError(f"skip={skip} leaves no query in a sequence of {t} tokens")
    mark = keys.reshape(-1, 1, 1, t).to(maps[0].dtype)  # [B or 1, 1, 1, T]
    return torch.stack([(w[:, :, skip:] * mark).sum(-1).mean(dim=(0, 2)) for w in maps])


def punctuation_keys(tokenizer, ids: Tensor) -> Tensor:
    """bool, shape of ``ids``: tokens whose text is only whitespace or punctuation (newlines, commas, full stops,
    quotes) — the tokens trained models use as secondary sinks."""
    flat = ids.reshape(-1).tolist()
    texts = {i: tokenizer.decode([i]) for i in set(flat)}
    plain = {i: bool(t) and all(not c.isalnum() for c in t) for i, t in texts.items()}
    return torch.tensor([plain[i] for i in flat]).reshape(ids.shape)


def uniform_mass(t: int, k: int = 1, skip: int | None = None) -> float:
    """The mass the first k keys would get if every query spread attention evenly (causal)."""
    skip = 4 * k if skip is None else skip
    return float(sum(k / (q + 1) for q in range(skip, t)) / (t - skip))


def sink_heads_share(mass: Tensor, threshold: float = 0.5) -> float:
    """Share of (layer, head) pairs whose sink mass exceeds ``threshold``."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    return float((mass > threshold).float().mean())


def top_k_mass(maps: list[Tensor], fractions: list[float], skip: int = 16) -> Tensor:
    """Attention sparsity: mean mass held by the top fraction of keys, per layer: [layers, len(fractions)].

    For each query (from ``skip`` on), its visible keys are sorted by weight; the share of its
    attention held by the top ``f`` of them is averaged over queries and heads.
    """
    out = []
    for w in maps:
        w = w[:, :, skip:]
        t = w.shape[-2]
        sorted_w = w.sort(dim=-1, descending=True).values.cumsum(-1)  # [B, H, T, S]
        visible = torch.arange(skip, skip + t) + 1  # keys each query can see
        row = []
        for f in fractions:
            k = (visible.float() * f).ceil().long().clamp(min=1) - 1  # index of the last kept key
            row.append(sorted_w.gather(-1, k.view(1, 1, t, 1).expand(*w.shape[:3], 1)).mean())
        out.append(torch.stack(row))
    return torch.stack(out)


def sink_kept(cache, n_sink: int = 1) -> dict:
    """Which (layer, KV head) still cache the first ``n_sink`` tokens: share over batch rows, [layers, H_kv].

    Pass it as ``inspect=`` to ``course.streaming.decode_stream``."""
    kept = torch.stack([(layer.live()[2] < n_sink).sum(-1).float().div(n_sink).mean(0) for layer in cache.layers])
    return {"sink_kept": kept.cpu()}


# ----------------------------------------------------------------------------- why a sink
def _per_block(model: CausalLM, ids: Tensor, caller: str, reduce) -> Tensor:
    """Run ``model`` on ``ids`` ([T] or [B, T]) once and stack ``reduce(h)`` over its blocks, ``h`` being a block's
    output for batch row 0 in float ([T, D]): [layers, *reduce's shape]."""
    ids = ids if ids.dim() == 2 else ids[None]
    model.config.check_tokens(ids.shape[1], caller)
    rows: list[Tensor] = []
    hooks = [b.register_forward_hook(lambda m, i, out: rows.append(reduce(out[0][0].float()).cpu()))
             for b in model.blocks]
    try:
        model(ids.to(model.device))
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(rows)


@torch.inference_mode()
def residual_norms(model: CausalLM, ids: Tensor) -> Tensor:
    """L2 norm of the residual stream after every block, for every position: [layers, T] (batch row 0)."""
    return _per_block(model, ids, "residual_norms", lambda h: h.norm(dim=-1))


@torch.inference_mode()
def activation_peaks(model: CausalLM, ids: Tensor) -> Tensor:
    """Single activations, as Sun et al. (2024) measure them: per block, the largest magnitude among the first
    token's hidden-state dimensions over the median magnitude of every activation of that block's output (all
    tokens, all dimensions): [layers] (batch row 0)."""
    return _per_block(model, ids, "activation_peaks", lambda h: h[0].abs().max() / h.abs().median())


@torch.inference_mode()
def value_norms(model: CausalLM, ids: Tensor) -> Tensor:
    """L2 norm of every token's value vector, mean over KV heads: [layers, T] (batch row 0), read from the cache."""
    ids = ids if ids.dim() == 2 else ids[None]
    model.config.check_tokens(ids.shape[1], "value_norms")
    cache = model.new_cache(ids.shape[0])
    model(ids.to(model.device), cache=cache)
    return torch.stack([layer.live()[1][0].float().norm(dim=-1).mean(0).cpu() for layer in cache.layers])


class _HideFirstKey(Policy):
    """Queries from position ``after`` on cannot see token 0 (earlier tokens were computed with it, as in
    a cache that evicts it)."""

    name = "hide-first-key"
    is_static = True

    def __init__(self, after: int) -> None:
        self.after = after

    def scores(self, layer, seen: int) -> Tensor:  # never evicts: no budget
        return layer.positions[:, :, : layer.length].float()

    def visible(self, q_pos: Tensor, k_pos: Tensor, slots: int | None = None) -> Tensor:
        return (k_pos != 0) | (q_pos < self.after)


@contextmanager
def _first_value_zeroed(model: CausalLM):
    """Inside: every layer's value vector of position 0 is zero (for plain forwards over a whole text)."""
    def zero(where: slice):
        def hook(module, inputs, out):
            out = out.clone()
            out[:, 0, where] = 0.0
            return out
        return hook

    hooks = [module.register_forward_hook(zero(where)) for module, where in model.value_outputs()]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


@torch.inference_mode()
def first_token_ablation(model: CausalLM, ids: Tensor, after: int = 16) -> dict[str, float]:
    """Perplexity over the predictions from position ``after`` on, three ways:

    * ``normal``: the model as it is;
    * ``zero_value``: token 0's value zeroed in every layer (it still takes attention, but contributes nothing);
    * ``no_key``: queries from ``after`` on cannot attend to token 0 at all (the softmax loses its resting place).
    """
    from course.streaming import exact_stream, next_token_nll

    ids = (ids if ids.dim() == 2 else ids[None]).to(model.device)
    if not 1 <= after < ids.shape[1] - 1:
        raise ValueError(f"after must be between 1 and {ids.shape[1] - 2} (ids has {ids.shape[1]} tokens), got {after}")
    model.config.check_tokens(ids.shape[1], "first_token_ablation")
    targets = ids[:, 1:]

    def ppl(nll: Tensor) -> float:
        return math.exp(nll[:, after:].double().mean().item())

    normal = ppl(next_token_nll(model(ids[:, :-1]).logits, targets))
    with _first_value_zeroed(model):
        zero_value = ppl(next_token_nll(model(ids[:, :-1]).logits, targets))
    no_key = ppl(exact_stream(model, ids, _HideFirstKey(after), progress=False).nll)
    return {"normal": normal, "zero_value": zero_value, "no_key": no_key}


@torch.inference_mode()
def gate_openness(model: CausalLM, ids: Tensor, skip: int = 4) -> Tensor:
    """How open each head's output gate is (gated attention, ``course.models.base.output_gate``): the mean of
    σ(X W_θ + b) over the batch, the queries from ``skip`` on and the head's d dimensions, [layers, heads].

    Qiu et al. (2025, Table 4) report a mean gate score of 0.116 for their elementwise gate: mostly closed."""
    gates = [block.attn.gate for block in model.blocks]
    if any(g is None for g in gates):
        raise ValueError(f"{model.config.name} has no output gate (ModelConfig.output_gate = "
                         f"{model.config.output_gate!r}): train or build it with output_gate='elementwise'")
    seen: list[Tensor] = []
    hooks = [g.proj.register_forward_hook(lambda module, args, out: seen.append(torch.sigmoid(out))) for g in gates]
    try:
        model(ids)
    finally:
        for h in hooks:
            h.remove()
    h = model.config.n_head
    return torch.stack([g[:, skip:].unflatten(-1, (h, -1)).mean(dim=(0, 1, 3)) for g in seen]).float().cpu()
