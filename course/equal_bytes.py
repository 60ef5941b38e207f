"""Comparing stores at the same bytes (notebook 08): what a store really holds, and eviction given as much.

A quantized store's size is not its asymptotic cost per token (b-bit codes plus scales): at a prompt's length it
also holds its full-precision residual, the key group not yet full and any exact sinks, each number at 16 bits.
``prompt_store_fraction`` measures it as held once the prompt is in the store. An eviction policy's bytes are its
slots, so ``slots_for`` gives it the smallest whole number of slots that holds at least those bytes: the comparison
is then at equal bytes to within one slot, the rounding in eviction's favour.

A passkey accuracy is k prompts right of n: ``course.stats.proportion_interval`` is its Wilson 95 % interval (each
contender's alone: unpaired, though the prompts are the same).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from course.compression import compress_prompts
from course.evaluate import NeedleTrial
from course.frontier import held_fraction
from course.models.base import CausalLM
from course.policies import Policy

__all__ = ["slots_for", "prompt_store_fraction"]

def slots_for(fraction: float, tokens: int) -> int:
    """The fewest slots an eviction policy needs to hold at least ``fraction`` of a full cache of ``tokens`` tokens
    (every slot a token at 16 bits): ceil(fraction x tokens)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be a positive integer, got {tokens!r}")
    return math.ceil(fraction * tokens - 1e-9)


@torch.inference_mode()
def prompt_store_fraction(model: CausalLM, trials: Sequence[NeedleTrial],
                          policy_for: Callable[[NeedleTrial], Policy]) -> list[float]:
    """Per trial, the bytes the store holds once the whole prompt is in it, as the answer's first token is
    predicted (the protocol of ``course.evaluate.compare_after_compression``: the prompt but its last token
    compressed, then the last token fed, at which a quantized store rounds the key groups that left its residual),
    counted as a packed store at 16 bits holds them (``KVCache.bytes_at``), as a fraction of the full cache of the
    prompt's tokens."""
    if not trials:
        raise ValueError("trials is empty: make some with course.evaluate.make_needle_trials")
    out = []
    for trial in trials:
        prompt = trial.prompt.to(model.device)
        (cache,), _ = compress_prompts(model, prompt[:, :-1], [policy_for(trial)], logits_to_keep=1)
        model(prompt[:, -1:], cache=cache)
        out.append(held_fraction(model, cache, prompt.shape[1]))
    return out
