"""Notebook 05 (SnapKV): checkers, each against the course's own mechanisms."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from course.builds import best_voted
from course.compression import compress_prompt, compress_prompts
from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close, first_difference, generator, policy_trace, tiny_model, token_ids
from course.exercises.guards import GuardedModel
from course.exercises.hints import hint
from course.function_policy import snapkv_policy
from course.kvcache import KVCache, LayerCache
from course.policies import PROTECTED, SnapKV, group_mean, make_policy

_SNAPKV = (SnapKV, snapkv_policy, make_policy)


def _snapkv_stat(attn: Tensor, kv_heads: int, kernel: int, pooling: str = "max") -> Tensor:
    """The course's SnapKV votes of one batch row: what ``SnapKV.observe`` writes for attention [H, w, S] of the
    window's queries over S slots in stream order: [kv_heads, S] (the window's own slots protected)."""
    h, w, s = attn.shape
    layer = LayerCache(torch.zeros(1, kv_heads, s, 1), torch.zeros(1, kv_heads, s, 1),
                       torch.arange(s).expand(1, kv_heads, s).clone(), length=s)
    SnapKV(s, w, kernel, pooling).observe(layer, attn[None], seen=s)
    return layer.stat("snapkv")[0]


def _keep_best(stat: Tensor, capacity: int) -> Tensor:
    """Slots the course's cache keeps when it compresses a prompt scored ``stat`` [kv_heads, S]: [kv_heads, C]."""
    kv, s = stat.shape
    cache = KVCache(1, 1, kv, 1, policy=SnapKV(capacity, 1, 1), max_tokens=s)
    cache.fill(torch.zeros(1, kv, s, 1), torch.zeros(1, kv, s, 1), torch.arange(s)[None], s,
               stats={"snapkv": stat[None]})
    cache.compress()
    return cache.positions(0)[0]


# ----------------------------------------------------------------------------- 1. votes
def _votes_with_course(attn: Tensor) -> Tensor:
    """AUTOFILL's votes: the course's SnapKV votes with no pooling (kernel 1), one KV head per query head."""
    return _snapkv_stat(attn, attn.shape[0], kernel=1)[:, : attn.shape[-1] - attn.shape[1]]


def _window_attention(h: int = 3, w: int = 4, s: int = 20, seed: int = 0) -> Tensor:
    g = generator(seed)
    scores = torch.randn(h, w, s, generator=g) * 2
    causal = torch.ones(w, s).tril(s - w).bool()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)


@exercise("05.observation_votes", "Exercise 1 (the observation window votes)", fallback=_votes_with_course,
          shortcuts=_SNAPKV)
def _check_votes(fn) -> None:
    attn = _window_attention()
    got, want = fn(attn), _votes_with_course(attn)
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
def _pool_with_course(votes: Tensor, kernel: int, kind: str = "max") -> Tensor:
    """AUTOFILL's pooling: the course's ``SnapKV.pool``."""
    return SnapKV(2, 1, kernel, kind).pool(votes[None])[0]


@exercise("05.pool_votes", "Exercise 2 (pooling keeps spans)", fallback=_pool_with_course, shortcuts=_SNAPKV)
def _check_pool(fn) -> None:
    g = generator(2)
    votes = torch.rand(3, 25, generator=g) ** 4
    for kernel, kind in ((5, "max"), (7, "avg"), (3, "max")):
        got, want = fn(votes, kernel, kind), _pool_with_course(votes, kernel, kind)
        if close(got, want):
            continue
        t = torch.as_tensor(got)
        if t.shape != votes.shape:
            raise Wrong(f"the pooled votes must keep the shape {tuple(votes.shape)}: stride 1 and padding kernel // 2")
        if kind == "avg" and close(got, F.avg_pool1d(votes[:, None], kernel, 1, kernel // 2)[:, 0]):
            raise Wrong("at the edges, average only over real positions (count_include_pad=False)")
        if close(got, _pool_with_course(votes, kernel, "avg" if kind == "max" else "max")):
            raise Wrong(f"kind={kind!r}: use {'max' if kind == 'max' else 'average'} pooling")
        raise Wrong(f"kernel={kernel}, kind={kind!r}: expected a centred pool of width {kernel} around each position")


# ----------------------------------------------------------------------------- 3. per-head selection
def _keep_with_course(votes: Tensor, capacity: int, window: int, kv_heads: int) -> Tensor:
    """AUTOFILL's selection: group-mean votes of the P prefix positions, the window (P .. P+w-1) protected, kept
    by the course's cache: [kv_heads, capacity] sorted positions."""
    p = votes.shape[-1]
    stat = torch.cat([group_mean(votes[None].float(), kv_heads)[0],
                      (PROTECTED + torch.arange(p, p + window)).float().expand(kv_heads, window)], dim=-1)
    return _keep_best(stat, capacity).sort(dim=-1).values


@exercise("05.snapkv_keep", "Exercise 3 (per-head selection with GQA)", fallback=_keep_with_course,
          shortcuts=(*_SNAPKV, group_mean, KVCache))
def _check_keep(fn) -> None:
    g = generator(4)
    votes = torch.rand(6, 30, generator=g)
    for capacity, window, kv in ((12, 4, 3), (8, 2, 2)):
        got, want = fn(votes, capacity, window, kv), _keep_with_course(votes, capacity, window, kv)
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
def _select_with_course(attn: Tensor, capacity: int, kernel: int, pooling: str, kv_heads: int) -> Tensor:
    """AUTOFILL's selection in the cache: the slots the course's SnapKV keeps, [kv_heads, capacity]."""
    return _keep_best(_snapkv_stat(attn, kv_heads, kernel, pooling), capacity)


def _per_kv(votes: Tensor, kv_heads: int) -> Tensor:
    return group_mean(votes[None], kv_heads)[0]


def _pool_over_window(attn: Tensor, kernel: int, pooling: str) -> Tensor:
    h, w, s = attn.shape
    x = attn.transpose(1, 2).reshape(h, s, w)
    return _pool_with_course(x.reshape(h * s, w), kernel, pooling).reshape(h, s, w).transpose(1, 2)


def _prefix(a: Tensor) -> Tensor:
    """The window's attention on the prefix slots: [H, w, S - w]."""
    return a[:, :, : a.shape[-1] - a.shape[1]]


# Wrong scorings of the prefix slots (attn [H, w, S], kernel, pooling, kv_heads -> [H_kv, P]), with the hint for
# that mistake.
_WRONG_SCORINGS = [
    (lambda a, k, p, kv: _per_kv(_prefix(a).sum(1), kv),
     "pool the votes along the keys (kernel neighbouring slots) so that spans survive"),
    (lambda a, k, p, kv: _per_kv(_prefix(_pool_over_window(a, k, p)).sum(1), kv),
     "pool along the keys (neighbouring slots of one query's votes), not across the observation window's queries"),
    (lambda a, k, p, kv: _per_kv(_prefix(_pool_with_course(a.reshape(-1, a.shape[-1]), k, p).reshape(a.shape))
                                 .sum(1), kv),
     "first sum the window's votes per key, then pool the summed votes (pooling each query's row first differs)"),
    (lambda a, k, p, kv: _pool_with_course(_per_kv(_prefix(a).sum(1), kv), k, p),
     "pool each query head's votes, then average the GQA group (max pooling does not commute with the mean)"),
    (lambda a, k, p, kv: _pool_with_course(_prefix(a).sum(1), k, p).reshape(-1, kv, a.shape[-1] - a.shape[1])
     .mean(0),
     "GQA grouping: query heads h*G .. h*G+G-1 share KV head h; average neighbouring heads, not every kv_heads-th"),
    (lambda a, k, p, kv: _per_kv(_pool_with_course(_prefix(a).sum(1), k, "avg" if p == "max" else "max"), kv),
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


@exercise("05.snapkv_select", "Exercise 4 (SnapKV's selection in the real cache)", points=2,
          fallback=_select_with_course, shortcuts=(*_SNAPKV, group_mean, KVCache))
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

    if top_everywhere(lambda a, k, p, kv: _snapkv_stat(a, kv, k, p)[:, : a.shape[-1] - a.shape[1]]):
        return  # the course's slots, or others tied with them
    diagnosis = next((h for score, h in _WRONG_SCORINGS if top_everywhere(score)), None)
    raise Wrong(diagnosis or "your slots are not the best-voted ones: sum the window's votes per prefix key, pool "
                "along the keys, average each GQA group, keep the capacity - w best plus the window")


# ----------------------------------------------------------------------------- 5. build: compressing a prompt
@torch.inference_mode()
def _compress_with_course(model, prompt: Tensor, capacity: int, window: int, kernel: int, pooling: str = "max"):
    """AUTOFILL's build: the course's SnapKV compression of the prompt."""
    return compress_prompt(model, prompt, SnapKV(capacity, window, kernel, pooling))[0]


def _course_votes(model, prompt: Tensor, policy) -> tuple[list[Tensor], list[tuple[Tensor, Tensor]]]:
    """The course's SnapKV votes of every layer before compression ([B, H_kv, P], the window protected) and
    every layer's full keys and values ([B, H_kv, P, d])."""
    cache = model.new_cache(prompt.shape[0], policy)
    with torch.inference_mode():
        model(prompt, cache=cache)
    return ([layer.stat("snapkv").clone() for layer in cache.layers],
            [(layer.live()[0].clone(), layer.live()[1].clone()) for layer in cache.layers])


def _compressed(fn, model, prompt: Tensor, capacity: int, window: int, kernel: int, pooling: str):
    """(the student's kept positions [L, B, H_kv, C] (sorted), every layer's (k, v, positions)) on ``model``."""
    with GuardedModel(model) as guarded:
        cache = fn(guarded, prompt.clone(), capacity, window, kernel, pooling)
    try:
        live = [layer.live() for layer in cache.layers]
    except AttributeError:
        raise Wrong(hint(2, "return the cache (model.new_cache), compressed in place with layer.gather")) from None
    return torch.stack([pos.sort(dim=-1).values for _, _, pos in live]), live


def _best_everywhere(kept: Tensor, votes: list[Tensor], window: int) -> bool:
    return all(best_voted(g, v, window) for g, v in zip(kept, votes))


def _diagnose_compress(fn, model, prompt, capacity, window, kernel, pooling, kept: Tensor) -> str:
    p = prompt.shape[1]
    if any(len(set(row.tolist())) < len(row) for row in kept.reshape(-1, kept.shape[-1])):
        return hint(3, "a slot is kept twice: vote for the prefix keys only (0 .. P-w-1); the window is kept anyway, "
                       "whatever it scores")
    if not bool((kept[..., -window:] == torch.arange(p - window, p)).all()):
        return hint(3, "keep the observation window itself (the last w slots) in every head, plus the capacity - w "
                       "best prefix keys")
    unpooled, _ = _course_votes(model, prompt, SnapKV(capacity, window, 1, pooling))
    if _best_everywhere(kept, unpooled, window):
        return hint(3, "pool the votes along the keys (kernel, stride 1, padding kernel // 2) before choosing: whole "
                       "spans survive, not isolated tokens")
    mha = tiny_model("llama", seed=8, n_layer=3, kv_heads=model.config.n_head)
    mha_kept, _ = _compressed(fn, mha, prompt, capacity, window, kernel, pooling)
    if _best_everywhere(mha_kept, _course_votes(mha, prompt, SnapKV(capacity, window, kernel, pooling))[0], window):
        return hint(2, "right when every query head has its own KV head, wrong with GQA: query heads h*G .. h*G+G-1 "
                       "share KV head h; average neighbouring heads (reshape(B, H_kv, G, P)), not every H_kv-th")
    return hint(1, f"capacity {capacity}, window {window}, kernel {kernel}, {pooling} pooling: your slots are not the "
                   "best-voted ones of the course's SnapKV (sum the window's weights per prefix key, pool, average "
                   "each GQA group, keep the capacity - w best plus the window)")


@exercise("05.snapkv_compress", "Build exercise (SnapKV compresses a prompt)", points=6, kind="build",
          fallback=_compress_with_course,
          shortcuts=(*_SNAPKV, compress_prompt, compress_prompts, KVCache.compress, group_mean))
def _check_snapkv_compress(fn) -> None:
    model = tiny_model("llama", seed=8, n_layer=3)
    prompt = torch.randint(0, 53, (2, 30), generator=generator(8))
    for capacity, window, kernel, pooling in ((12, 4, 3, "avg"), (10, 3, 5, "avg"), (14, 4, 5, "max")):
        votes, full = _course_votes(model, prompt, SnapKV(capacity, window, kernel, pooling))  # the oracle
        kept, live = _compressed(fn, model, prompt, capacity, window, kernel, pooling)
        if kept.shape[-1] != capacity:
            raise Wrong(hint(2, f"every layer must keep {capacity} slots per KV head, got {kept.shape[-1]}"))
        if not _best_everywhere(kept, votes, window):
            raise Wrong(_diagnose_compress(fn, model, prompt, capacity, window, kernel, pooling, kept))
        for (k, v, pos), (k_full, v_full) in zip(live, full):
            idx = pos[..., None].expand(-1, -1, -1, k.shape[-1])
            if not (close(k, k_full.gather(2, idx), 1e-9) and close(v, v_full.gather(2, idx), 1e-9)):
                raise Wrong(hint(2, "the right positions are kept but not their keys/values: gather keys, values "
                                    "and positions together (layer.gather)"))
