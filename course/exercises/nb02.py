"""Notebook 02 (attention sinks): references and checkers."""

from __future__ import annotations

import torch
from torch import Tensor

from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close


# ----------------------------------------------------------------------------- 1. sink mass
def sink_mass_per_head(attn: Tensor, k: int = 1, skip: int = 4) -> Tensor:
    """Mean attention mass on the first ``k`` keys, per head. attn: [H, T, T] -> [H].

    Queries before position ``skip`` are left out (they can only look at the first tokens).
    """
    return attn[:, skip:, :k].sum(-1).mean(-1)


def _random_attention(h: int = 3, t: int = 12, seed: int = 0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(h, t, t, generator=g) * 2
    scores[:, :, 0] += 2.0  # some sink
    causal = torch.ones(t, t).tril().bool()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)


@exercise("02.sink_mass_per_head", "Exercise 1 (attention mass on the sink)", sink_mass_per_head)
def _check_sink_mass(fn) -> None:
    attn = _random_attention()
    for k, skip in ((1, 4), (2, 3), (4, 6)):
        got, want = fn(attn, k, skip), sink_mass_per_head(attn, k, skip)
        if close(got, want):
            continue
        if close(got, attn[:, :, :k].sum(-1).mean(-1)):
            raise Wrong("leave out the first `skip` queries: they can only attend to the first tokens")
        if close(got, attn[:, skip:, :k].sum(-1).sum(-1)):
            raise Wrong("average over the queries (mean), do not sum them")
        if close(got, attn[:, :k, skip:].sum(-2).mean(-1)) or close(got, attn[:, skip:, k]):
            raise Wrong("rows are queries and columns are keys: take the first k *columns* (keys) of each row")
        if close(got, attn[:, skip:, :k].mean(-1).mean(-1)):
            raise Wrong("the mass on the first k keys is the *sum* of their weights, not the mean")
        raise Wrong(f"for k={k}, skip={skip} expected {want.tolist()}, got {got!r}")


# ----------------------------------------------------------------------------- 2. which tokens are kept
def kept_positions(t: int, window: int, n_sink: int) -> list[int]:
    """Positions in a [sinks | recent window] cache while token ``t`` is processed (t included).

    The cache holds at most n_sink + window tokens: the first n_sink tokens of the stream and the
    ``window`` most recent ones.
    """
    recent = range(max(0, t - window + 1), t + 1)
    return sorted(set(range(min(n_sink, t + 1))) | set(recent))


@exercise("02.kept_positions", "Exercise 2 (which tokens a sink + window cache keeps)", kept_positions)
def _check_kept_positions(fn) -> None:
    for t, window, n_sink in ((3, 5, 2), (10, 4, 2), (20, 6, 4), (9, 3, 0), (5, 8, 4), (100, 10, 1)):
        want = kept_positions(t, window, n_sink)
        got = fn(t, window, n_sink)
        try:
            got = sorted(int(x) for x in got)
        except TypeError:
            raise Wrong("return a list of token positions (ints)") from None
        if got == want:
            continue
        if len(got) == len(want) + 1 and set(want) <= set(got):
            raise Wrong(f"your cache keeps one token too many at t={t}: the window holds {window} tokens, "
                        "the current token included (off by one)")
        if len(got) == len(want) - 1 and set(got) <= set(want) and t not in got:
            raise Wrong("the current token t is in the cache too: it attends to itself")
        if n_sink and not set(range(min(n_sink, t + 1))) <= set(got):
            raise Wrong(f"the sink was evicted: positions 0..{n_sink - 1} must stay in the cache at t={t}")
        if len(got) != len(set(got)):
            raise Wrong("a token appears twice: early on, the sinks are also among the recent tokens")
        raise Wrong(f"kept_positions({t}, window={window}, n_sink={n_sink}) should be {want}, got {got}")


# ----------------------------------------------------------------------------- 3. evicting from a softmax
def renormalise_without(weights: Tensor, keep: Tensor) -> Tensor:
    """Attention weights after evicting keys: weights [..., S], keep bool [S] -> [..., S].

    Softmax over the kept keys only equals the old weights of the kept keys divided by their sum:
    w'_j = w_j / sum_{i kept} w_i, and 0 for evicted keys.
    """
    kept = weights * keep
    return kept / kept.sum(-1, keepdim=True)


@exercise("02.renormalise_without", "Exercise 3 (what eviction does to a softmax)", renormalise_without)
def _check_renormalise(fn) -> None:
    g = torch.Generator().manual_seed(3)
    weights = torch.softmax(torch.randn(4, 9, generator=g) * 2, -1)
    for keep in (torch.tensor([0, 1, 1, 1, 0, 1, 1, 1, 1]).bool(), torch.arange(9) > 0):
        got, want = fn(weights, keep), renormalise_without(weights, keep)
        if close(got, want):
            continue
        if close(got, weights * keep):
            raise Wrong("after eviction the weights must sum to 1 again: divide by the kept mass")
        if close(got, want * keep + weights * ~keep) or not close((torch.as_tensor(got) * ~keep).abs().sum(), 0.0):
            raise Wrong("evicted keys must get weight 0")
        if close(got, torch.softmax(weights.masked_fill(~keep, float("-inf")), -1)):
            raise Wrong("these are already probabilities: renormalise them, do not apply softmax to them again")
        raise Wrong("expected w_j / sum of kept w for kept keys and 0 for evicted ones")


# ----------------------------------------------------------------------------- 4. build: the streaming evaluation loop
@torch.inference_mode()
def window_stream_nll(model, ids: Tensor, window: int, n_sink: int = 0) -> Tensor:
    """The collapse curve's loop: stream ``ids`` [B, T] one token at a time through a cache that keeps the
    first ``n_sink`` tokens and the last ``window`` (the new token included), and score every next token.

    Before each token is fed, a full cache (n_sink + window slots) drops its oldest non-sink slot in every
    layer (``layer.gather``); tokens keep their original positions. Returns NLL [B, T - 1] (float32 or
    wider): entry t is -log p(ids[:, t + 1] | what the cache let token t see).
    """
    return _stream_nll(model, ids, window, n_sink)


def _stream_nll(model, ids: Tensor, window: int, n_sink: int, slack: int = 0, pin: bool = True,
                shift: int = 1) -> Tensor:
    """``window_stream_nll`` and its typical mistakes: ``slack=1`` lets the cache reach window + n_sink + 1
    slots (the new token not counted), ``pin=False`` keeps the last n_sink + window tokens (sinks evicted),
    ``shift=0`` scores the token just fed instead of the next one."""
    b, kv = ids.shape[0], model.config.n_kv_head
    cache = model.new_cache(batch=b)
    budget = n_sink + window
    nll = []
    for t in range(ids.shape[1] - 1):
        n = cache.layers[0].length
        if n >= budget + slack:  # the new token needs a slot: drop the oldest non-sink token
            first = n_sink if pin else 0
            keep = torch.cat([torch.arange(first), torch.arange(n - (budget - first) + 1 - slack, n)])
            for layer in cache.layers:
                layer.gather(keep.expand(b, kv, keep.numel()))
        logits = model(ids[:, t : t + 1], cache=cache).logits[:, -1].double()  # [B, vocab]
        target = ids[:, t + shift : t + shift + 1]
        nll.append(torch.logsumexp(logits, -1) - logits.gather(-1, target)[:, 0])
    return torch.stack(nll, dim=1)


_STREAM_MISTAKES = [
    (dict(slack=1), "the new token counts in the budget: drop a slot *before* feeding a token once the cache holds "
                    "n_sink + window tokens, so that it never attends to more than n_sink + window keys"),
    (dict(pin=False), "the first n_sink tokens are never evicted: drop the oldest token *after* the sinks"),
    (dict(shift=0), "score the *next* token: the logits of token t predict ids[:, t + 1]"),
]


@exercise("02.window_stream_nll", "Build exercise (the streaming loop behind the collapse curve)",
          window_stream_nll, points=3)
def _check_window_stream_nll(fn) -> None:
    from course.exercises.fixtures import CallCounter, tiny_model
    from course.policies import make_policy
    from course.streaming import decode_stream

    ids = torch.randint(0, 53, (2, 24), generator=torch.Generator().manual_seed(3))
    for family, window, n_sink in (("gpt2", 8, 0), ("gpt2", 6, 2), ("llama", 5, 3)):
        model = tiny_model(family, seed=3)
        name = "streaming" if n_sink else "window"
        policy = make_policy(name, n_sink + window, sinks=n_sink, positions="original", model=model)
        want = decode_stream(model, ids, policy, progress=False).nll.double()  # the course's cache, the oracle
        counter = CallCounter(model)
        got = fn(counter, ids.clone(), window, n_sink)
        got = torch.as_tensor(got)
        if tuple(got.shape) != tuple(want.shape):
            raise Wrong(f"return the NLL of every predicted token, [batch, T - 1] = {tuple(want.shape)}, "
                        f"got {tuple(got.shape)}")
        if any(n != 1 for n in counter.calls):
            raise Wrong("feed one token per forward call through the cache (your calls got "
                        f"{sorted(set(counter.calls))} "
                        "tokens): streaming never recomputes the window")
        if close(got, want, 1e-6):
            continue
        step = int(((got.double() - want).abs() > 1e-6).any(0).nonzero()[0])
        for settings, hint in _STREAM_MISTAKES:
            if close(got, _stream_nll(model, ids, window, n_sink, **settings), 1e-6):
                raise Wrong(hint)
        raise Wrong(f"{family}, window {window}, {n_sink} sinks: the NLL differs from the course's cache from "
                    f"prediction {step} on (the cache fills at token {n_sink + window})")
