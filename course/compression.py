"""Prompt compression, the one step the course's generation and evaluations share: the prompt runs once with
full causal attention whatever the policy, then the cache is compressed to the policy's budget
(``KVCache.compress``); decoding goes on through the compressed cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from course.kvcache import CacheGroup, KVCache
from course.models.base import CausalLM
from course.policies import Policy

__all__ = ["compress_prompt", "compress_prompts"]


@torch.inference_mode()
def compress_prompts(model: CausalLM, prompt: Tensor, policies: Sequence[Policy | None],
                     logits_to_keep: int = 0) -> tuple[list[KVCache], Tensor]:
    """The one prompt-compression step of the course, for several policies at once.

    prompt: [B, P]. The prompt runs once, with full causal attention whatever the policy, through a
    ``CacheGroup`` of one fresh cache per policy (each policy reads the attention it needs from that
    one forward: H2O accumulates it, SnapKV's observation window votes); then every cache is
    compressed to its policy's budget. Every contender therefore starts from the same computation.
    Returns the caches (in the order of ``policies``) and the prompt's logits [B, P, V] (the last
    ``logits_to_keep`` positions' only, when it is not 0: generation needs just the last)."""
    if not policies:
        raise ValueError("policies is empty: give at least one policy (None is the full cache)")
    prompt = prompt.to(model.device)
    model.config.check_tokens(prompt.shape[1], "the prompt")
    # one forward feeds every cache: all take keys before rotation if one holds a quantized store (course.quantize)
    rotated = False if any(getattr(policy, "quantizer", None) is not None for policy in policies) else None
    caches = [model.new_cache(prompt.shape[0], policy, chunks="prompt", rotated=rotated) for policy in policies]
    shared = caches[0] if len(caches) == 1 else CacheGroup(caches)  # one policy needs no group
    logits = model(prompt, cache=shared, logits_to_keep=logits_to_keep).logits
    for cache in caches:
        cache.compress()
    return caches, logits


@torch.inference_mode()
def compress_prompt(model: CausalLM, prompt: Tensor, policy: Policy | None,
                    cache: KVCache | None = None, logits_to_keep: int = 0) -> tuple[KVCache, Tensor]:
    """``compress_prompts`` for one policy: returns its compressed cache and the prompt's logits [B, P, V]
    (or the last ``logits_to_keep`` positions').

    ``cache``: continue one (a chat's next turn; its own policy applies) instead of a new one."""
    if cache is None:
        caches, logits = compress_prompts(model, prompt, [policy], logits_to_keep)
        return caches[0], logits
    prompt = prompt.to(model.device)
    model.config.check_tokens(prompt.shape[1] + cache.seen, "the prompt")
    logits = model(prompt, cache=cache, logits_to_keep=logits_to_keep).logits
    cache.compress()
    return cache, logits
