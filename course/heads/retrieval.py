"""Which heads copy the needle: the retrieval score of every query head (Wu et al. 2024, arXiv 2404.15574).

A head *copies* an answer token when, at the query that predicts it, its strongest attention (the arg-max over
the keys) lands on a needle position that holds that very token. Its retrieval score is the share of answer
tokens it copies, averaged over trials: 1 for a head that always points at the token being pasted, 0 for one
that never does (Wu et al., Sec. 2, the copy-paste rate over the needle's tokens). The prompt and the answer are
teacher-forced through a full cache, so every trial scores every answer token whatever the model would have said.

    scores = retrieval_scores(model, trials)   # [layers, heads], each in [0, 1]
    kv_head_scores(scores, n_kv_heads)         # [layers, kv heads]: what a head-wise cache decides on
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from course.evaluate import NeedleTrial
from course.models.base import CausalLM
from course.progress import progress_bar

__all__ = ["copy_hits", "retrieval_scores", "kv_head_scores", "top_heads", "top_share"]


def copy_hits(weights: Tensor, key_positions: Tensor, tokens: Tensor, answer: Tensor,
              needle: tuple[int, int]) -> Tensor:
    """Which heads copy which answer token, for one layer of one trial: bool [H, A].

    weights: [H, A, S] attention of the A queries that predict the answer tokens (row i predicts answer[i]) over
    S cached slots; key_positions: [H_kv, S] the original position of each slot (query head h reads KV head
    h // (H / H_kv)); tokens: [P] the prompt's ids; answer: [A] ids; needle: (first, last + 1) positions.
    A head copies answer[i] when its arg-max slot holds a position inside the needle whose token is answer[i]."""
    h, a, _ = weights.shape
    if weights.shape[1] != answer.shape[0]:
        raise ValueError(f"weights has {a} query rows but answer has {answer.shape[0]} tokens: give one row per token")
    group = h // key_positions.shape[0]
    top = weights.argmax(-1)  # [H, A] slot of each head's strongest attention
    pos = key_positions.repeat_interleave(group, dim=0).gather(1, top)  # [H, A] its original position
    lo, hi = needle
    inside = (pos >= lo) & (pos < hi)
    token = tokens[pos.clamp(max=tokens.shape[0] - 1)]
    return inside & (token == answer.to(token.device)[None])


@torch.inference_mode()
def _trial_hits(model: CausalLM, trial: NeedleTrial) -> Tensor:
    """Hit rates of every query head on one trial, [L, H]: the prompt but its last token goes through a full
    cache, then its last token and the answer but its last (the queries that predict the answer) with weights."""
    device = model.device
    prompt, answer = trial.prompt.to(device), trial.answer.to(device)
    cache = model.new_cache(1, max_tokens=prompt.shape[1] + answer.shape[0])
    model(prompt[:, :-1], cache=cache, logits_to_keep=1)
    feed = torch.cat([prompt[:, -1:], answer[None, :-1]], dim=1)
    out = model(feed, cache=cache, output_attentions=True, logits_to_keep=1)
    return torch.stack([copy_hits(w[0].float(), k[0], prompt[0], answer, trial.needle).float().mean(-1)
                        for w, k in zip(out.attentions, out.key_positions)]).cpu()


def retrieval_scores(model: CausalLM, trials: list[NeedleTrial], progress: bool = False) -> Tensor:
    """The retrieval score of every query head, [layers, heads] in [0, 1]: per trial, the share of the answer's
    tokens (every token of ``trial.answer``: with SmolLM2's tokenizer the space and the five digits) that the head
    copies from the needle (``copy_hits``), averaged over ``trials``."""
    if not trials:
        raise ValueError("trials is empty: make some with course.evaluate.make_needle_trials")
    longest = max(t.prompt.shape[1] + t.answer.shape[0] for t in trials)
    model.config.check_tokens(longest, "the longest passkey prompt + answer")
    rates = [_trial_hits(model, t) for t in progress_bar(trials, desc="retrieval scores", enabled=progress)]
    return torch.stack(rates).mean(0)


def kv_head_scores(scores: Tensor, n_kv_heads: int) -> Tensor:
    """Per KV head, the largest retrieval score among the query heads that share it: [L, H] -> [L, H_kv].

    The maximum, not the mean: a cache keeps or drops a KV head's slots for all its query heads at once, and one
    retrieving query head is enough to need them (a mean would let two idle heads outvote it)."""
    if scores.dim() != 2:
        raise ValueError(f"scores must be [layers, heads], got shape {tuple(scores.shape)}")
    layers, heads = scores.shape
    if n_kv_heads < 1 or heads % n_kv_heads:
        raise ValueError(f"n_kv_heads must divide the {heads} query heads, got {n_kv_heads}")
    return scores.reshape(layers, n_kv_heads, heads // n_kv_heads).amax(-1)


def top_heads(scores: Tensor, k: int) -> Tensor:
    """The ``k`` highest-scoring heads as a bool mask shaped like ``scores`` (ties: the earlier head first)."""
    if not 0 <= k <= scores.numel():
        raise ValueError(f"k must be between 0 and {scores.numel()} (the number of heads), got {k}")
    order = torch.argsort(scores.flatten(), descending=True, stable=True)
    mask = torch.zeros(scores.numel(), dtype=torch.bool)
    mask[order[:k]] = True
    return mask.view(scores.shape)


def top_share(scores: Tensor, fraction: float) -> float:
    """How concentrated the scores are: the share of their total held by the top ``fraction`` of heads
    (ceil(fraction · heads) of them). 0 when every score is 0."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    total = float(scores.sum())
    if total == 0.0:
        return 0.0
    k = math.ceil(fraction * scores.numel())
    return float(scores.flatten().sort(descending=True).values[:k].sum()) / total
