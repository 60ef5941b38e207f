"""Notebook 05 (SnapKV): references and checkers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from course.grading.core import Wrong, exercise
from course.grading.exercises.fixtures import close
from course.policies import group_mean


# ----------------------------------------------------------------------------- 1. votes
def observation_votes(attn: Tensor) -> Tensor:
    """Votes of the observation window for the keys before it.

    attn: [H, w, S] attention of the prompt's last w queries over all S prompt keys (the window's
    own keys are the last w). Returns [H, S - w]: each prefix key's summed attention from the window.
    """
    w = attn.shape[1]
    return attn[:, :, : attn.shape[-1] - w].sum(1)


def _window_attention(h: int = 3, w: int = 4, s: int = 20, seed: int = 0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(h, w, s, generator=g) * 2
    causal = torch.ones(w, s).tril(s - w).bool()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)


@exercise("05.observation_votes", "Exercise 1 (the observation window votes)", observation_votes)
def _check_votes(fn) -> None:
    attn = _window_attention()
    got, want = fn(attn), observation_votes(attn)
    if close(got, want):
        return
    if close(got, attn.sum(1)):
        raise Wrong("leave the window's own keys (the last w columns) out: SnapKV always keeps them")
    if close(got, attn[:, :, :-4].mean(1)):
        raise Wrong("sum the votes of the window's queries (a mean ranks the same but is not what was asked)")
    if close(got, attn[:, :, :-4].sum(0)) or close(got, attn[:, :, :-4].sum(-1)):
        raise Wrong("keep one row of votes per head: sum over the window's queries (dim 1) only")
    raise Wrong("expected attn[:, :, :S-w].sum over the window queries")


# ----------------------------------------------------------------------------- 2. pooling
def pool_votes(votes: Tensor, kernel: int, kind: str = "max") -> Tensor:
    """Pool votes over neighbouring positions so spans survive: [H, S] -> [H, S] (stride 1, centred)."""
    x = votes[:, None]
    if kind == "max":
        return F.max_pool1d(x, kernel, stride=1, padding=kernel // 2)[:, 0]
    return F.avg_pool1d(x, kernel, stride=1, padding=kernel // 2, count_include_pad=False)[:, 0]


@exercise("05.pool_votes", "Exercise 2 (pooling keeps spans)", pool_votes)
def _check_pool(fn) -> None:
    g = torch.Generator().manual_seed(2)
    votes = torch.rand(3, 25, generator=g) ** 4
    for kernel, kind in ((5, "max"), (7, "avg"), (3, "max")):
        got, want = fn(votes, kernel, kind), pool_votes(votes, kernel, kind)
        if close(got, want):
            continue
        t = torch.as_tensor(got)
        if t.shape != votes.shape:
            raise Wrong(f"the pooled votes must keep the shape {tuple(votes.shape)}: stride 1 and padding kernel // 2")
        if kind == "avg" and close(got, F.avg_pool1d(votes[:, None], kernel, 1, kernel // 2)[:, 0]):
            raise Wrong("at the edges, average only over real positions (count_include_pad=False)")
        if close(got, pool_votes(votes, kernel, "avg" if kind == "max" else "max")):
            raise Wrong(f"kind={kind!r}: use {'max' if kind == 'max' else 'average'} pooling")
        raise Wrong(f"kernel={kernel}, kind={kind!r}: expected a centred pool of width {kernel} around each position")


# ----------------------------------------------------------------------------- 3. per-head selection
def snapkv_keep(votes: Tensor, capacity: int, window: int, kv_heads: int) -> Tensor:
    """Positions SnapKV keeps per KV head.

    votes: [H, P] pooled votes for the P prefix positions (the window follows them, at P..P+window-1).
    Average the votes of the query heads sharing a KV head, keep the capacity - window best prefix
    positions and the whole window. Returns [kv_heads, capacity] sorted positions.
    """
    p = votes.shape[-1]
    per_kv = group_mean(votes[None], kv_heads)[0]  # [kv_heads, P]
    top = per_kv.topk(capacity - window, dim=-1).indices
    win = torch.arange(p, p + window).expand(kv_heads, window)
    return torch.cat([top, win], dim=-1).sort(dim=-1).values


@exercise("05.snapkv_keep", "Exercise 3 (per-head selection with GQA)", snapkv_keep)
def _check_keep(fn) -> None:
    g = torch.Generator().manual_seed(4)
    votes = torch.rand(6, 30, generator=g)
    for capacity, window, kv in ((12, 4, 3), (8, 2, 2)):
        got, want = fn(votes, capacity, window, kv), snapkv_keep(votes, capacity, window, kv)
        try:
            got = torch.as_tensor(got).sort(dim=-1).values
        except (TypeError, RuntimeError):
            raise Wrong("return a [kv_heads, capacity] tensor of positions") from None
        if torch.equal(got, want):
            continue
        if got.shape != want.shape:
            raise Wrong(f"expected shape {tuple(want.shape)} (one row per KV head, capacity positions each), "
                        f"got {tuple(got.shape)}")
        if not bool((got[:, -window:] == torch.arange(30, 30 + window)).all()):
            raise Wrong("the observation window (positions P .. P+window-1) is always kept")
        wrong_group = votes.reshape(6 // kv, kv, 30).mean(0).topk(capacity - window, -1).indices
        if torch.equal(got[:, : capacity - window], wrong_group.sort(-1).values):
            raise Wrong("query heads h*G .. h*G+G-1 share KV head h: average neighbouring heads")
        raise Wrong("keep, per KV head, the capacity - window prefix positions with the highest group-mean votes")
