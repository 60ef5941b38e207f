"""Plans whose heads differ by kind: every head alike (``uniform``), DuoAttention's retrieval and streaming heads
(``duo_attention``) and the same at a given number of bytes (``duo_at_bytes``)."""

from __future__ import annotations

import torch
from torch import Tensor

from course.headwise.plan import HeadPlan, HeadwisePolicy, Part
from course.policies import FullCache, Policy, StreamingLLM
from course.policies.base import check_int

__all__ = ["uniform", "duo_attention", "duo_at_bytes"]


def uniform(config, policy: Policy) -> HeadwisePolicy:
    """Every KV head of every layer under ``policy``: the cache it makes is exactly ``KVCache`` with that policy.
    ``config``: the model's ``ModelConfig``."""
    part = Part(tuple(range(config.n_kv_head)), policy)
    return HeadwisePolicy(HeadPlan(tuple((part,) for _ in range(config.n_layer)), config.n_kv_head), policy.label)


def _check_heads(config, name: str, heads: Tensor) -> None:
    shape = (config.n_layer, config.n_kv_head)
    if not isinstance(heads, Tensor) or tuple(heads.shape) != shape:
        got = tuple(heads.shape) if isinstance(heads, Tensor) else type(heads).__name__
        raise ValueError(f"{name} must be a [layers, kv_heads] = {list(shape)} tensor, got {got}")


def duo_attention(config, retrieval: Tensor, sinks: int = 4, window: int | Tensor = 60) -> HeadwisePolicy:
    """DuoAttention's cache (Xiao et al. 2024, arXiv 2410.10819, Sec. 3.1): retrieval heads keep every token (a full
    cache), streaming heads keep ``sinks`` attention sinks and a recent ``window`` (StreamingLLM's slots, at their
    original positions, as DuoAttention's streaming heads attend).

    retrieval: [L, H_kv] bool, True for a retrieval KV head; window: one window for every streaming head, or [L,
    H_kv] long, each streaming head's own (``duo_at_bytes`` matches a byte total so); ``config``: the model's
    ``ModelConfig``. Heads of one kind and window share a part of the cache."""
    _check_heads(config, "retrieval", retrieval)
    if retrieval.dtype != torch.bool:
        raise ValueError(f"retrieval must be a bool tensor (True: a retrieval head), got dtype {retrieval.dtype}")
    check_int("sinks", sinks, 0)
    if isinstance(window, Tensor):
        _check_heads(config, "window", window)
        windows = window.long()
    else:
        windows = torch.full(tuple(retrieval.shape), check_int("window", window, 1), dtype=torch.long)
    if bool((windows[~retrieval.cpu()] < 1).any()):
        raise ValueError(f"window must be >= 1 for every streaming head, got {windows[~retrieval.cpu()].min()}")
    layers = []
    for layer in range(config.n_layer):
        groups: dict[int, list[int]] = {}  # window (0: a retrieval head) -> its heads
        for h in range(config.n_kv_head):
            groups.setdefault(0 if retrieval[layer, h] else int(windows[layer, h]), []).append(h)
        layers.append(tuple(Part(tuple(heads), FullCache() if w == 0 else StreamingLLM(sinks, w, "original"))
                            for w, heads in sorted(groups.items())))
    n_full, n = int(retrieval.sum()), retrieval.numel()
    shown = int(windows[~retrieval.cpu()].max()) if n_full < n else 0
    label = f"duo({n_full}/{n} full, {sinks}+{shown})"
    return HeadwisePolicy(HeadPlan(tuple(layers), config.n_kv_head), label)


def duo_at_bytes(config, head_scores: Tensor, prompt_tokens: int, budget: int, sinks: int = 4) -> HeadwisePolicy:
    """A DuoAttention cache holding exactly ``L * H_kv * budget`` slots after the prompt (the bytes of a uniform
    ``budget`` per head): the most retrieval heads that fit, chosen by ``head_scores`` ([L, H_kv], higher: more of
    a retrieval head; ties to the lower index), each holding the ``prompt_tokens`` the compressed prompt has; the
    streaming heads share the rest, ``sinks`` + a window each, the windows differing by at most one slot (the
    extra slots to the best-scored streaming heads).

    prompt_tokens: the tokens in the cache when it is compressed (``compare_after_compression`` compresses all of
    a prompt of P tokens but the last: P - 1). Each streaming head needs ``sinks + 1`` slots at least."""
    _check_heads(config, "head_scores", head_scores)
    check_int("sinks", sinks, 0)
    check_int("prompt_tokens", prompt_tokens, sinks + 2)
    if isinstance(budget, bool) or not isinstance(budget, int) or not sinks + 1 <= budget < prompt_tokens:
        raise ValueError(f"budget must be an integer between sinks + 1 = {sinks + 1} and prompt_tokens - 1 = "
                         f"{prompt_tokens - 1} (at prompt_tokens every head holds the whole prompt), got {budget!r}")
    n = config.n_layer * config.n_kv_head
    # the most retrieval heads k with k * P + (n - k) * (sinks + 1) <= n * budget
    k = n * (budget - sinks - 1) // (prompt_tokens - sinks - 1)
    order = torch.sort(head_scores.flatten().float().cpu(), descending=True, stable=True).indices
    left, streaming = n * budget - k * prompt_tokens, n - k
    slots = torch.full((streaming,), left // streaming, dtype=torch.long)
    slots[: left % streaming] += 1
    retrieval = torch.zeros(n, dtype=torch.bool)
    retrieval[order[:k]] = True
    windows = torch.zeros(n, dtype=torch.long)
    windows[order[k:]] = slots - sinks
    shape = (config.n_layer, config.n_kv_head)
    plan = duo_attention(config, retrieval.view(shape), sinks, windows.view(shape)).plan
    return HeadwisePolicy(plan, f"duo@{budget}({k}/{n} full)")
