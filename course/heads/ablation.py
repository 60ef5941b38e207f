"""The causal test of retrieval heads: silence some heads and ask for the needle again.

``masked_heads`` zeroes chosen query heads' outputs before the output projection W_O (in both model families,
``course.models.base.merge_heads``), so the rest of the network no longer hears them; ``random_heads`` draws the
control, as many heads at random among the others. Wu et al. (2024, arXiv 2404.15574, Sec. 3) report that masking
the top retrieval heads breaks needle retrieval while masking as many random heads barely moves it.

    with masked_heads(model, top_heads(scores, 8)):
        ...                                            # every forward in here runs without those heads
    needle_accuracy_masked(model, trials, top_heads(scores, 8))   # accuracy, correct/n, Wilson interval
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from course.evaluate import NeedleTrial, needle_eval
from course.models.base import CausalLM
from course.splits import split_seed
from course.stats import proportion_interval

__all__ = ["masked_heads", "random_heads", "needle_accuracy_masked"]


def _check_heads(model: CausalLM, heads: Tensor) -> Tensor:
    c = model.config
    if heads.dtype != torch.bool or tuple(heads.shape) != (c.n_layer, c.n_head):
        raise ValueError(f"heads must be a bool mask [layers, heads] = {(c.n_layer, c.n_head)} for {c.name}, "
                         f"got {heads.dtype} {tuple(heads.shape)}")
    return heads


@contextmanager
def masked_heads(model: CausalLM, heads: Tensor) -> Iterator[CausalLM]:
    """Inside, the query heads marked in ``heads`` (bool [layers, heads]) output zeros before W_O; masks nest (a
    head masked outside stays masked inside). On leaving, every layer gets back the mask it had."""
    attns = [block.attn for block in model.blocks]
    before = [a.head_mask for a in attns]
    rows = _check_heads(model, heads).to(model.device)
    try:
        for attn, old, row in zip(attns, before, rows):
            merged = row if old is None else old | row
            attn.head_mask = merged if merged.any() else None
        yield model
    finally:
        for attn, old in zip(attns, before):
            attn.head_mask = old


def random_heads(scores: Tensor, k: int, seed: int = 0, exclude: Tensor | None = None,
                 split: str | None = None) -> Tensor:
    """``k`` heads drawn uniformly, without replacement, among the heads of ``scores``' shape [layers, heads] that
    ``exclude`` (bool, same shape; e.g. the top retrieval heads) does not mark: a bool mask of that shape. The draw
    is seeded by ``split``'s seed for ``seed`` (``course.splits.split_seed``): the same arguments, the same heads."""
    exclude = torch.zeros(scores.shape, dtype=torch.bool) if exclude is None else exclude.cpu()
    if exclude.shape != scores.shape or exclude.dtype != torch.bool:
        raise ValueError(f"exclude must be a bool mask shaped like scores {tuple(scores.shape)}, "
                         f"got {exclude.dtype} {tuple(exclude.shape)}")
    free = (~exclude).flatten().nonzero()[:, 0]
    if not 0 <= k <= free.numel():
        raise ValueError(f"k must be between 0 and {free.numel()} (the heads not excluded), got {k}")
    gen = torch.Generator().manual_seed(split_seed(seed, split))
    mask = torch.zeros(scores.numel(), dtype=torch.bool)
    mask[free[torch.randperm(free.numel(), generator=gen)[:k]]] = True
    return mask.view(scores.shape)


def needle_accuracy_masked(model: CausalLM, trials: list[NeedleTrial], heads: Tensor, progress: bool = False) -> dict:
    """Needle accuracy with the ``heads`` (bool [layers, heads]) masked and the full cache
    (``course.evaluate.needle_eval``'s protocol). Returns accuracy, correct, n, the Wilson 95 % interval
    (low, high) of the accuracy (``course.stats.proportion_interval``), mean_answer_logprob, masked (how many
    heads) and exact (per trial)."""
    with masked_heads(model, heads):
        result = needle_eval(model, trials, lambda trial: None, progress=progress)
    exact = [bool(row["exact"]) for row in result["trials"]]
    low, high = proportion_interval(sum(exact), len(exact))
    return {"accuracy": result["accuracy"], "correct": sum(exact), "n": len(exact), "low": low, "high": high,
            "mean_answer_logprob": result["mean_answer_logprob"], "masked": int(heads.sum()), "exact": exact}
