"""Notebook 03 (StreamingLLM): references and checkers."""

from __future__ import annotations

import torch
from torch import Tensor

from course.function_policy import streaming_policy
from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close, first_difference, policy_trace, tiny_model, token_ids
from course.models.llama import rope
from course.policies import make_policy


# ----------------------------------------------------------------------------- 1. positions in the cache
def cache_positions(original: Tensor) -> Tensor:
    """StreamingLLM's position re-assignment: the rank of each slot's original position.

    original: [S] original positions of the cached tokens, in slot order (a ring buffer is not
    sorted). Returns [S]: 0 for the oldest cached token, ..., S-1 for the newest.
    """
    return original.argsort().argsort()


@exercise("03.cache_positions", "Exercise 1 (positions inside the cache)", cache_positions)
def _check_cache_positions(fn) -> None:
    cases = [torch.tensor([0, 1, 2, 3, 20, 21, 14, 15, 16, 17, 18, 19]),  # sinks + ring buffer
             torch.tensor([0, 1, 2, 3, 4, 5]), torch.tensor([0, 9, 7, 8])]
    for original in cases:
        got = fn(original.clone())
        want = cache_positions(original)
        if close(got, want):
            continue
        if close(got, original):
            raise Wrong("these are the original positions: StreamingLLM gives the cached tokens positions 0..n-1")
        if close(got, torch.arange(len(original))):
            raise Wrong("slot order is not token order (the recent part is a ring buffer): rank the slots by their "
                        "original position")
        if close(got, original.argsort()):
            raise Wrong("argsort gives, for each rank, the slot that has it; you need the inverse: for each slot, "
                        "its rank (argsort twice)")
        raise Wrong(f"for original positions {original.tolist()} expected {want.tolist()}")
    _check_ranks_in_the_cache(fn)


def _check_ranks_in_the_cache(fn) -> None:
    """The re-assignment plugged into the real cache: a StreamingLLM stream on a tiny RoPE model."""
    model, ids = tiny_model("llama"), token_ids(30, seed=1)
    want = policy_trace(model, ids, make_policy("streaming", 8, sinks=2, model=model))
    try:
        got = policy_trace(model, ids, streaming_policy(streaming_scores, 8, 2, model=model, ranks=fn))
    except ValueError as e:
        raise Wrong(f"in the cache: {e}") from None
    if not close(got[1], want[1], 1e-9):
        raise Wrong("plugged into a StreamingLLM cache (2 sinks + 6 recent slots) your positions give another NLL "
                    "than the course's: every slot must get the rank of its original position among the cached ones")


# ----------------------------------------------------------------------------- 2. re-rotating cached keys
def rerotate(k_rot: Tensor, old_pos: Tensor, new_pos: Tensor, theta: float = 10000.0) -> Tensor:
    """Move keys that were cached *after* rotation to new positions: RoPE(new) = R(new - old) RoPE(old).

    k_rot: [heads, N, d] keys rotated at old_pos [N]; returns them rotated at new_pos [N].
    """
    return rope(k_rot[None], (new_pos - old_pos)[None], theta)[0]


@exercise("03.rerotate", "Exercise 2 (re-rotating cached keys)", rerotate)
def _check_rerotate(fn) -> None:
    g = torch.Generator().manual_seed(0)
    cases = [(torch.tensor([0, 1, 50, 51, 52, 53]), torch.tensor([0, 1, 2, 3, 4, 5]), 1, 10000.0),
             (torch.tensor([0, 1, 2, 3, 907, 904, 905, 906]), torch.tensor([0, 1, 2, 3, 7, 4, 5, 6]), 3, 100000.0)]
    for old, new, heads, theta in cases:
        k = torch.randn(heads, len(old), 8, generator=g, dtype=torch.float64)  # [heads, N, d]
        k_old = rope(k[None], old[None], theta)[0]
        want = rope(k[None], new[None], theta)[0]
        got = fn(k_old, old, new, theta)
        if close(got, want, 1e-6):
            continue
        if close(got, rope(k_old[None], new[None], theta)[0], 1e-6):
            raise Wrong("the keys are already rotated by their old positions: rotate by the *difference* new - old")
        if close(got, rope(k_old[None], (old - new)[None], theta)[0], 1e-6):
            raise Wrong("wrong direction: rotate by new - old, not old - new")
        if close(got, rope(k_old[None], (new - old)[None], 10000.0)[0], 1e-6):
            raise Wrong(f"use the theta you are given ({theta:g}): models differ (SmolLM2 uses 100000)")
        raise Wrong("RoPE rotations compose: rotating by a then by b is rotating by a + b; "
                    "use course.models.llama.rope")


# ----------------------------------------------------------------------------- 3. the ring buffer
def rolling_slot(t: int, n_sink: int, window: int) -> int:
    """Slot where token t is written in a preallocated [n_sink | window] cache.

    The first n_sink + window tokens fill the slots in order; afterwards each new token overwrites
    the oldest recent token, cycling through slots n_sink .. n_sink + window - 1. Sinks never move.
    """
    if t < n_sink + window:
        return t
    return n_sink + (t - n_sink) % window


@exercise("03.rolling_slot", "Exercise 3 (a ring buffer that never moves the sinks)", rolling_slot)
def _check_rolling_slot(fn) -> None:
    for n_sink, window in ((4, 6), (1, 3), (0, 5), (2, 2)):
        got = [fn(t, n_sink, window) for t in range(40)]
        want = [rolling_slot(t, n_sink, window) for t in range(40)]
        if got == want:
            continue
        if n_sink and any(s < n_sink for s in got[n_sink:]):
            raise Wrong(f"a sink slot was overwritten (n_sink={n_sink}): recent tokens cycle through slots "
                        f"{n_sink}..{n_sink + window - 1} only")
        if any(s >= n_sink + window or s < 0 for s in got):
            raise Wrong(f"slots run from 0 to n_sink + window - 1 = {n_sink + window - 1}")
        first = next(t for t in range(40) if got[t] != want[t])
        raise Wrong(f"token {first} should go to slot {want[first]} (n_sink={n_sink}, window={window}), "
                    f"got {got[first]}: each new token must overwrite the *oldest* recent one")


# ----------------------------------------------------------------------------- 4. StreamingLLM as a policy
def streaming_scores(positions: Tensor, seen: int, n_sink: int) -> Tensor:
    """StreamingLLM's keep-priority of every cached slot (the cache overwrites the lowest when full).

    positions: [H_kv, S] original positions of the cached tokens (slot order); seen: tokens processed
    so far. The first ``n_sink`` tokens of the stream are never evicted (inf); among the others the
    oldest goes first, so the priority is the position itself. Returns [H_kv, S] float.
    """
    return torch.where(positions < n_sink, torch.inf, positions.float())


def _sorted_lists(kept: Tensor) -> list[int]:
    return kept[0, 0].tolist()


@exercise("03.streaming_scores", "Exercise 4 (StreamingLLM as a policy in the real cache)", streaming_scores, points=2)
def _check_streaming_scores(fn) -> None:
    model, ids = tiny_model("llama"), token_ids(40, seed=2)
    for n_sink, budget in ((4, 10), (1, 7), (0, 6)):
        want_kept, want_nll = policy_trace(model, ids, make_policy("streaming", budget, sinks=n_sink, model=model))
        try:
            got_kept, got_nll = policy_trace(model, ids, streaming_policy(fn, budget, n_sink, model=model))
        except ValueError as e:
            raise Wrong(str(e)) from None
        step = first_difference(got_kept, want_kept)
        if step is None and close(got_nll, want_nll, 1e-9):
            continue
        if step is None:
            raise Wrong("the cache kept the right tokens but the NLL differs: return one score per slot, in slot order")
        got, want = set(_sorted_lists(got_kept[step])), set(_sorted_lists(want_kept[step]))
        lost, extra = sorted(want - got), sorted(got - want)
        if any(p < n_sink for p in lost):
            raise Wrong(f"you evicted a pinned sink (position {min(lost)}, n_sink={n_sink}) after token {step}: the "
                        "first n_sink positions must score inf")
        if lost and max(lost) == step - 1 or step in lost:
            raise Wrong("you evicted the newest token: the cache overwrites the slot with the *lowest* score, so the "
                        "oldest non-sink token must score lowest")
        if extra == [n_sink]:
            raise Wrong(f"position {n_sink} is never evicted (off by one): pin exactly the first n_sink tokens, "
                        f"positions 0 .. {n_sink - 1}")
        raise Wrong(f"with {n_sink} sinks and {budget} slots, after token {step} the cache should hold positions "
                    f"{sorted(want)}, yours holds {sorted(got)}")


# ----------------------------------------------------------------------------- 5. build: the rolling cache
def rolling_step(state, q: Tensor, k: Tensor, v: Tensor, t: int, n_sink: int, window: int, theta: float):
    """One layer's attention for token ``t`` through StreamingLLM's rolling cache, built from scratch.

    state: what this layer's cache held after token t - 1 (None before the first token); q: [B, H, 1, d],
    k, v: [B, H_kv, 1, d], all *not* rotated. The cache has n_sink + window slots: token t goes to
    ``rolling_slot(t, n_sink, window)`` (sinks stay, the ring buffer overwrites its oldest token). Keys are
    cached un-rotated and rotated at every step by their rank among the cached positions (0 .. n-1); the
    query takes rank n - 1. Returns (output [B, H, 1, d], the new state).
    """
    return _rolling_step(state, q, k, v, t, n_sink, window, theta)


def _rolling_step(state, q, k, v, t, n_sink, window, theta, slots: str = "ring", rule: str = "ranks",
                  query: str = "rank"):
    """``rolling_step`` and its typical mistakes: ``slots="modulo"`` cycles through every slot (sinks
    overwritten); ``rule="original"`` rotates keys by their original position, ``rule="slots"`` by their slot
    index; ``query="original"`` rotates the query by t."""
    b, hkv, _, d = k.shape
    size = n_sink + window
    if state is None:
        state = {"k": k.new_zeros(b, hkv, size, d), "v": v.new_zeros(b, hkv, size, d),
                 "pos": torch.full((size,), -1, dtype=torch.long)}
    slot = (t if t < size else n_sink + (t - n_sink) % window) if slots == "ring" else t % size
    state["k"][:, :, slot], state["v"][:, :, slot], state["pos"][slot] = k[:, :, 0], v[:, :, 0], t
    n = min(t + 1, size)
    pos, keys, values = state["pos"][:n], state["k"][:, :, :n], state["v"][:, :, :n]
    key_pos = {"ranks": pos.argsort().argsort(), "original": pos, "slots": torch.arange(n)}[rule]
    q_pos = torch.full((b, 1), n - 1 if query == "rank" else t)
    kr, qr = rope(keys, key_pos.expand(b, n), theta), rope(q, q_pos, theta)
    g = q.shape[1] // hkv  # query heads per KV head
    scores = qr @ kr.repeat_interleave(g, 1).transpose(-1, -2) / d**0.5  # [B, H, 1, n]
    return torch.softmax(scores, dim=-1) @ values.repeat_interleave(g, 1), state


@torch.inference_mode()
def drive_layers(model, ids: Tensor, step, *settings) -> Tensor:
    """Run the course's Llama token by token with ``step`` as every layer's attention: logits [B, T, vocab].

    Everything but the attention is the model's own (embedding, norms, projections, MLP); ``step`` gets the
    un-rotated q, k, v of each layer, ``t``, the cache's ``settings`` (03: n_sink, window; 04: budget, recent)
    and the RoPE base, and returns the heads' output and its new state."""
    cfg = model.config
    b, h, hkv, d = ids.shape[0], cfg.n_head, cfg.n_kv_head, cfg.head_dim
    states, rows = [None] * cfg.n_layer, []
    for t in range(ids.shape[1]):
        x = model.tok_emb(ids[:, t : t + 1])
        for i, block in enumerate(model.blocks):
            a, z = block.attn, block.norm1(x)
            q = a.q(z).view(b, 1, h, d).transpose(1, 2)
            k, v = (m(z).view(b, 1, hkv, d).transpose(1, 2) for m in (a.k, a.v))
            out = step(states[i], q, k, v, t, *settings, cfg.rope_theta)
            if not isinstance(out, tuple) or len(out) != 2:
                raise Wrong("return a tuple (output [B, H, 1, d], state)")
            y, states[i] = torch.as_tensor(out[0]), out[1]
            if tuple(y.shape) != (b, h, 1, d):
                raise Wrong(f"the output must be [B, H, 1, d] = {(b, h, 1, d)} (one row per query head), "
                            f"got {tuple(y.shape)}")
            x = x + a.o(y.to(x.dtype).transpose(1, 2).reshape(b, 1, h * d))
            x = x + block.mlp(block.norm2(x))
        rows.append(model.lm_head(model.norm(x)))
    return torch.cat(rows, dim=1)


_ROLLING_MISTAKES = [
    (dict(slots="modulo"), "a sink slot was overwritten: once the cache is full, token t goes to slot "
                           "n_sink + (t - n_sink) % window, never below n_sink"),
    (dict(rule="original"), "these are the original positions: StreamingLLM rotates every cached key by its rank "
                            "among the cached positions (0 .. n-1), so that no distance exceeds the cache"),
    (dict(rule="slots"), "slot order is not token order (the ring buffer wraps around): rank the slots by their "
                         "original position (argsort twice), do not use the slot index"),
    (dict(query="original"), "the query takes the newest rank, n - 1 (n cached tokens), not its original position t"),
]


@exercise("03.rolling_step", "Build exercise (the rolling cache, re-assigned and re-rotated)", rolling_step,
          points=3)
def _check_rolling_step(fn) -> None:
    from course.streaming import decode_stream

    model, ids = tiny_model("llama", seed=5), token_ids(22, seed=5).expand(2, -1).clone()
    ids[1] = token_ids(22, seed=6)[0]
    for n_sink, window in ((2, 6), (1, 4), (0, 5)):
        policy = make_policy("streaming", n_sink + window, sinks=n_sink, model=model)  # the cache rule
        want_nll = decode_stream(model, ids, policy, progress=False).nll.double()  # the course's cache, the oracle
        want = drive_layers(model, ids, _rolling_step, n_sink, window)
        got = drive_layers(model, ids, fn, n_sink, window)
        got_nll = torch.logsumexp(got.double(), -1)[:, :-1] - got.double()[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
        assert close(torch.logsumexp(want.double(), -1)[:, :-1] - want.double()[:, :-1].gather(
            -1, ids[:, 1:, None])[..., 0], want_nll, 1e-9), "the reference must equal the course's cache"
        if close(got_nll, want_nll, 1e-6):
            continue
        step = int(((got_nll - want_nll).abs() > 1e-6).any(0).nonzero()[0])
        for settings, hint in _ROLLING_MISTAKES:
            if close(got, drive_layers(model, ids, lambda *a, s=settings: _rolling_step(*a, **s), n_sink, window),
                     1e-6):
                raise Wrong(hint)
        raise Wrong(f"{n_sink} sinks + {window} recent slots: the predictions differ from the course's StreamingLLM "
                    f"cache from token {step} on (the cache fills at token {n_sink + window})")
