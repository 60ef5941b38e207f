"""Notebook 05 (SnapKV): references and checkers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from course.function_policy import snapkv_policy
from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close, first_difference, policy_trace, tiny_model, token_ids
from course.policies import group_mean, make_policy


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


# ----------------------------------------------------------------------------- 4. SnapKV as a policy
def snapkv_select(attn: Tensor, capacity: int, kernel: int, pooling: str, kv_heads: int) -> Tensor:
    """The slots SnapKV keeps of a prompt, per KV head, from its observation window's attention.

    attn: [H, w, S] attention of the prompt's last w queries over its S slots (the window's own keys are
    the last w). Votes: each prefix slot's attention summed over the w queries; pooled along the keys
    (``pooling`` "max" or "avg", centred, width ``kernel``); averaged within each GQA group (query heads
    h*G .. h*G+G-1 share KV head h); the capacity - w best prefix slots plus the w window slots.
    Returns [kv_heads, capacity] slot indices.
    """
    h, w, s = attn.shape
    votes = attn[:, :, : s - w].sum(1)  # [H, P]
    per_kv = pool_votes(votes, kernel, pooling).reshape(kv_heads, h // kv_heads, -1).mean(1)  # [H_kv, P]
    top = per_kv.topk(capacity - w, dim=-1).indices
    return torch.cat([top, torch.arange(s - w, s).expand(kv_heads, w)], dim=-1)


def _per_kv(votes: Tensor, kv_heads: int) -> Tensor:
    return group_mean(votes[None], kv_heads)[0]


def _pool_over_window(attn: Tensor, kernel: int, pooling: str) -> Tensor:
    h, w, s = attn.shape
    x = attn.transpose(1, 2).reshape(h, s, w)
    return pool_votes(x.reshape(h * s, w), kernel, pooling).reshape(h, s, w).transpose(1, 2)


# Scores a wrong SnapKV ranks the prefix slots by (attn [H, w, S], kernel, pooling, kv_heads -> [H_kv, P]),
# with the hint for that mistake; the first is the reference.
_SCORINGS = [
    (lambda a, k, p, kv: _per_kv(pool_votes(a[:, :, : a.shape[-1] - a.shape[1]].sum(1), k, p), kv), None),
    (lambda a, k, p, kv: _per_kv(a[:, :, : a.shape[-1] - a.shape[1]].sum(1), kv),
     "pool the votes along the keys (kernel neighbouring slots) so that spans survive"),
    (lambda a, k, p, kv: _per_kv(_pool_over_window(a, k, p)[:, :, : a.shape[-1] - a.shape[1]].sum(1), kv),
     "pool along the keys (neighbouring slots of one query's votes), not across the observation window's queries"),
    (lambda a, k, p, kv: _per_kv(pool_votes(a.reshape(-1, a.shape[-1]), k, p).reshape(a.shape)
                                 [:, :, : a.shape[-1] - a.shape[1]].sum(1), kv),
     "first sum the window's votes per key, then pool the summed votes (pooling each query's row first differs)"),
    (lambda a, k, p, kv: pool_votes(_per_kv(a[:, :, : a.shape[-1] - a.shape[1]].sum(1), kv), k, p),
     "pool each query head's votes, then average the GQA group (max pooling does not commute with the mean)"),
    (lambda a, k, p, kv: pool_votes(a[:, :, : a.shape[-1] - a.shape[1]].sum(1), k, p).reshape(
        -1, kv, a.shape[-1] - a.shape[1]).mean(0),
     "GQA grouping: query heads h*G .. h*G+G-1 share KV head h; average neighbouring heads, not every kv_heads-th"),
    (lambda a, k, p, kv: _per_kv(pool_votes(a[:, :, : a.shape[-1] - a.shape[1]].sum(1), k,
                                            "avg" if p == "max" else "max"), kv),
     "use the pooling asked for (`pooling` is 'max' or 'avg')"),
]


def _is_top_set(keep: Tensor, scores: Tensor, w: int) -> bool:
    """Is ``keep`` ([H_kv, capacity]) the window (slots P .. P+w-1) plus a best-scored set of prefix slots under
    ``scores`` ([H_kv, P]), ties in any order?"""
    p = scores.shape[-1]
    for row, sc in zip(keep.tolist(), scores.double()):
        prefix = [k for k in row if k < p]
        if sorted(k for k in row if k >= p) != list(range(p, p + w)) or len(prefix) != len(row) - w:
            return False
        mask = torch.zeros(p, dtype=torch.bool)
        mask[prefix] = True
        if bool((~mask).any()) and float(sc[mask].min()) < float(sc[~mask].max()) - 1e-5:
            return False
    return True


@exercise("05.snapkv_select", "Exercise 4 (SnapKV's selection in the real cache)", snapkv_select, points=2)
def _check_snapkv_select(fn) -> None:
    model, ids = tiny_model("llama"), token_ids(36, seed=4)
    kv, calls = model.config.n_kv_head, []  # (attn, kept slots, kernel, pooling) of every call
    for capacity, window, kernel, pooling in ((12, 4, 5, "max"), (10, 3, 3, "avg")):

        def recorded(attn, cap, k, pool, n_kv):
            keep = fn(attn, cap, k, pool, n_kv)
            calls.append((attn, keep, k, pool))
            return keep

        settings = dict(obs_window=window, kernel=kernel, pooling=pooling)
        n_before = len(calls)
        want_kept, want_nll = policy_trace(model, ids, make_policy("snapkv", capacity, model=model, **settings), 30)
        try:
            got_kept, got_nll = policy_trace(model, ids, snapkv_policy(recorded, capacity, model=model, **settings), 30)
        except ValueError as e:
            if "different slots" in str(e):
                raise Wrong(f"{e}: the window's own slots are kept anyway; vote for the prefix slots 0 .. S-w-1 only") \
                    from None
            raise Wrong(str(e)) from None
        if len(calls) == n_before:
            raise Wrong("the select function was never called")
        if any(not set(range(a.shape[-1] - window, a.shape[-1])) <= set(torch.as_tensor(k).flatten().tolist())
               for a, k, _, _ in calls[n_before:]):
            raise Wrong("the observation window (the last w slots) is always kept, in every KV head")
        if first_difference(got_kept, want_kept) is None and not close(got_nll, want_nll, 1e-6):
            raise Wrong("the cache kept the course's slots but the NLL differs")

    def top_everywhere(score) -> bool:
        return all(_is_top_set(torch.as_tensor(k), score(a, ker, pool, kv), a.shape[1]) for a, k, ker, pool in calls)

    if top_everywhere(_SCORINGS[0][0]):
        return  # the course's slots, or others tied with them
    hint = next((h for score, h in _SCORINGS[1:] if top_everywhere(score)), None)
    raise Wrong(hint or "your slots are not the best-voted ones: sum the window's votes per prefix key, pool along "
                "the keys, average each GQA group, keep the capacity - w best plus the window")


# ----------------------------------------------------------------------------- 5. build: compressing a prompt
@torch.inference_mode()
def snapkv_compress(model, prompt: Tensor, capacity: int, window: int, kernel: int, pooling: str = "max"):
    """SnapKV end to end: run the prompt [B, P] through a fresh cache, then cut every layer to ``capacity``
    slots per KV head, chosen by the last ``window`` queries' votes.

    Per layer: sum the window's attention weights on each prefix key (keys 0 .. P-w-1), pool the votes along
    the keys (``kernel``, max or avg, stride 1, same length), average each GQA group of query heads
    (heads h*G .. h*G+G-1 share KV head h), keep the ``capacity - window`` best prefix keys plus the window,
    in position order (``layer.gather``). Returns the compressed cache.
    """
    return _snapkv_compress(model, prompt, capacity, window, kernel, pooling)


def _snapkv_compress(model, prompt, capacity, window, kernel, pooling="max", votes="prefix", group="neighbours",
                     keep_window=True):
    """``snapkv_compress`` and its typical mistakes: ``votes="all"`` lets the window vote for its own keys too
    (they then take places of the prefix's and are kept twice), ``group="strided"`` averages heads h, h + H_kv, ...,
    ``keep_window=False`` keeps the ``capacity`` best prefix keys and drops the window."""
    b, p = prompt.shape
    h, hkv = model.config.n_head, model.config.n_kv_head
    cache = model.new_cache(batch=b)
    out = model(prompt, cache=cache, output_attentions=True)
    n_prefix = p - window if votes == "prefix" else p
    for layer, attn in zip(cache.layers, out.attentions):
        v = attn[:, :, -window:, :n_prefix].double().sum(dim=2)  # [B, H, P - w]: the window's votes
        if pooling != "none":  # "none": the checker's mistake of skipping the pooling
            pool = F.max_pool1d if pooling == "max" else \
                (lambda x, k, s, pad: F.avg_pool1d(x, k, s, pad, count_include_pad=False))
            v = pool(v.reshape(b * h, 1, n_prefix), kernel, 1, kernel // 2).reshape(b, h, n_prefix)
        v = v.reshape(b, hkv, h // hkv, n_prefix).mean(2) if group == "neighbours" else \
            v.reshape(b, h // hkv, hkv, n_prefix).mean(1)  # [B, H_kv, P - w]
        if not keep_window:
            keep = v.topk(capacity, dim=-1).indices
        else:  # with votes="all" the window's keys compete for the prefix's places (and come back twice)
            best = v.topk(capacity - window, dim=-1).indices
            keep = torch.cat([best, torch.arange(p - window, p).expand(b, hkv, window)], dim=-1)
        layer.gather(keep.sort(dim=-1).values)
    return cache


_SNAPKV_MISTAKES = [
    (dict(votes="all"), "vote for the prefix keys only (0 .. P-w-1): the window is kept anyway, whatever it scores"),
    (dict(group="strided"), "GQA grouping: query heads h*G .. h*G+G-1 share KV head h; average neighbouring heads, "
                            "not every H_kv-th"),
    (dict(keep_window=False), "keep the observation window itself (the last w slots) in every head, plus the "
                              "capacity - w best prefix keys"),
    (dict(pooling="none"), "pool the votes along the keys (kernel, stride 1, padding kernel // 2) before choosing: "
                           "whole spans survive, not isolated tokens"),
]


def _course_votes(model, prompt: Tensor, policy) -> tuple[list[Tensor], list[tuple[Tensor, Tensor]]]:
    """The course's SnapKV votes of every layer before compression ([B, H_kv, P], the window protected) and
    every layer's full keys and values ([B, H_kv, P, d])."""
    cache = model.new_cache(prompt.shape[0], policy)
    with torch.inference_mode():
        model(prompt, cache=cache)
    return ([layer.stat("snapkv").clone() for layer in cache.layers],
            [(layer.live()[0].clone(), layer.live()[1].clone()) for layer in cache.layers])


def _is_best(kept: Tensor, votes: Tensor, window: int) -> bool:
    """Is every row of ``kept`` ([B, H_kv, C] positions) the window plus a best-voted set of prefix keys?"""
    p = votes.shape[-1]
    for row, v in zip(kept.reshape(-1, kept.shape[-1]), votes.reshape(-1, p).double()):
        mask = torch.zeros(p, dtype=torch.bool)
        mask[row] = True
        if not bool(mask[p - window :].all()) or int(mask.sum()) != len(row):
            return False
        prefix_kept, prefix_left = v[: p - window][mask[: p - window]], v[: p - window][~mask[: p - window]]
        if len(prefix_left) and float(prefix_kept.min()) < float(prefix_left.max()) - 1e-5:
            return False
    return True


@exercise("05.snapkv_compress", "Build exercise (SnapKV compresses a prompt)", snapkv_compress, points=3)
def _check_snapkv_compress(fn) -> None:
    from course.policies import SnapKV

    model = tiny_model("llama", seed=8, n_layer=3)
    prompt = torch.randint(0, 53, (2, 30), generator=torch.Generator().manual_seed(8))
    for capacity, window, kernel, pooling in ((12, 4, 3, "avg"), (10, 3, 5, "avg"), (14, 4, 5, "max")):
        votes, full = _course_votes(model, prompt, SnapKV(capacity, window, kernel, pooling))  # the oracle
        cache = fn(model, prompt.clone(), capacity, window, kernel, pooling)
        try:
            live = [layer.live() for layer in cache.layers]
        except AttributeError:
            raise Wrong("return the cache (model.new_cache), compressed in place with layer.gather") from None
        got = torch.stack([pos.sort(dim=-1).values for _, _, pos in live])  # [L, B, H_kv, C]
        if got.shape[-1] != capacity:
            raise Wrong(f"every layer must keep {capacity} slots per KV head, got {got.shape[-1]}")
        if all(_is_best(g, v, window) for g, v in zip(got, votes)):
            for (k, v, pos), (k_full, v_full) in zip(live, full):
                idx = pos[..., None].expand(-1, -1, -1, k.shape[-1])
                if not (close(k, k_full.gather(2, idx), 1e-9) and close(v, v_full.gather(2, idx), 1e-9)):
                    raise Wrong("the right positions are kept but not their keys/values: gather keys, values and "
                                "positions together (layer.gather)")
            continue
        for settings, hint in _SNAPKV_MISTAKES:
            wrong = _snapkv_compress(model, prompt, capacity, window, kernel, **{"pooling": pooling, **settings})
            if torch.equal(got, torch.stack([layer.live()[2].sort(dim=-1).values for layer in wrong.layers])):
                raise Wrong(hint)
        raise Wrong(f"capacity {capacity}, window {window}, kernel {kernel}, {pooling} pooling: your slots are not "
                    "the best-voted ones of the course's SnapKV (sum the window's weights per prefix key, pool, "
                    "average each GQA group, keep the capacity - w best plus the window)")
