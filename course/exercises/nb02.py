"""Notebook 02 (attention sinks): checkers, each against the course's own mechanisms."""

from __future__ import annotations

import torch
from torch import Tensor

from course.attention_analysis import key_mass, sink_mass
from course.models.attend import attention_weights
from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close, generator, tiny_model
from course.exercises.guards import GuardedModel
from course.exercises.hints import hint
from course.policies import PinSinks, SlidingWindow, StreamingLLM, make_policy
from course.streaming import decode_stream, evaluate_stream, exact_stream


# ----------------------------------------------------------------------------- 1. sink mass
def _sink_mass_with_course(attn: Tensor, k: int = 1, skip: int = 4) -> Tensor:
    """AUTOFILL's sink mass per head: the course's ``sink_mass`` of one layer's map."""
    return sink_mass([attn[None]], k, skip)[0]


def _random_attention(h: int = 3, t: int = 12, seed: int = 0) -> Tensor:
    g = generator(seed)
    scores = torch.randn(h, t, t, generator=g) * 2
    scores[:, :, 0] += 2.0  # some sink
    causal = torch.ones(t, t).tril().bool()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)


@exercise("02.sink_mass_per_head", "Exercise 1 (attention mass on the sink)", fallback=_sink_mass_with_course,
          shortcuts=(sink_mass, key_mass))
def _check_sink_mass(fn) -> None:
    attn = _random_attention()
    for k, skip in ((1, 4), (2, 3), (4, 6)):
        given = attn.clone()
        got, want = fn(given, k, skip), _sink_mass_with_course(attn, k, skip)
        case = f"attn {tuple(attn.shape)} ({attn.dtype}), k={k}, skip={skip}"
        if not torch.equal(given, attn):
            raise Wrong(f"{case}: your function changed `attn` in place; leave it as it was (the notebook reuses "
                        "the attention maps) and return a new tensor")
        if not isinstance(got, Tensor):
            raise Wrong(f"{case}: return a tensor [H] = [{attn.shape[0]}], got {type(got).__name__}")
        if close(got, want):
            if got.dtype != attn.dtype:
                raise Wrong(f"{case}: the values are right, but return them in attn's dtype ({attn.dtype}), got "
                            f"{got.dtype} (the cell below compares with torch.allclose, which refuses mixed dtypes)")
            continue
        if close(got, attn[:, :, :k].sum(-1).mean(-1)):
            raise Wrong("leave out the first `skip` queries: they can only attend to the first tokens")
        if close(got, attn[:, skip:, :k].sum(-1).sum(-1)):
            raise Wrong("average over the queries (mean), do not sum them")
        if close(got, attn[:, :k, skip:].sum(-2).mean(-1)) or close(got, attn[:, skip:, k]):
            raise Wrong("rows are queries and columns are keys: take the first k *columns* (keys) of each row")
        if close(got, attn[:, skip:, :k].mean(-1).mean(-1)):
            raise Wrong("the mass on the first k keys is the *sum* of their weights, not the mean")
        raise Wrong(f"{case}: expected one number per head, the mean over queries skip..T-1 of the weights on keys "
                    f"0..k-1 summed, shape {tuple(want.shape)}: {[round(x, 4) for x in want.tolist()]}; got shape "
                    f"{tuple(got.shape)}: {[round(x, 4) for x in got.double().flatten()[:6].tolist()]}")


# ----------------------------------------------------------------------------- 2. which tokens are kept
def _kept_by_policy(t: int, window: int, n_sink: int) -> list[int]:
    """AUTOFILL's kept positions: what the course's StreamingLLM (original positions) lets token t see."""
    policy = make_policy("streaming", n_sink + window, sinks=n_sink, positions="original")
    keys = torch.arange(t + 1)
    return keys[policy.visible(torch.tensor(t), keys)].tolist()


@exercise("02.kept_positions", "Exercise 2 (which tokens a sink + window cache keeps)", fallback=_kept_by_policy,
          shortcuts=(make_policy, StreamingLLM, PinSinks, SlidingWindow))
def _check_kept_positions(fn) -> None:
    for t, window, n_sink in ((3, 5, 2), (10, 4, 2), (20, 6, 4), (9, 3, 0), (5, 8, 4), (100, 10, 1)):
        want = _kept_by_policy(t, window, n_sink)
        returned = fn(t, window, n_sink)
        try:
            got = sorted(int(x) for x in returned)
        except (TypeError, ValueError):
            raise Wrong(f"kept_positions({t}, window={window}, n_sink={n_sink}): return a list of token positions "
                        f"(ints), e.g. {want}; got {returned!r}") from None
        if got == want:
            if not isinstance(returned, list) or [int(x) for x in returned] != want:
                raise Wrong(f"kept_positions({t}, window={window}, n_sink={n_sink}): the right positions, but return "
                            f"them as a list of ints in increasing order, {want}; got {returned!r} (a "
                            f"{type(returned).__name__}): the cell below compares it with a sorted list")
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
def _softmax_over_kept(weights: Tensor, keep: Tensor) -> Tensor:
    """AUTOFILL's renormalisation: the course's masked attention weights over scores that are the log-weights
    (each query's log-weights against one-hot keys, the evicted keys masked): weights [..., S] -> [..., S]."""
    s = weights.shape[-1]
    queries = weights.log().reshape(1, 1, -1, s)  # [1, 1, rows, S]: row r's scores are its log-weights
    mask = keep.bool().expand(1, 1, queries.shape[2], s)
    out = attention_weights(queries, torch.eye(s, dtype=weights.dtype)[None, None], mask, scale=1.0)
    return out.reshape(weights.shape)


@exercise("02.renormalise_without", "Exercise 3 (what eviction does to a softmax)", fallback=_softmax_over_kept,
          shortcuts=(attention_weights,))
def _check_renormalise(fn) -> None:
    g = generator(3)
    weights = torch.softmax(torch.randn(4, 9, generator=g) * 2, -1)
    for keep in (torch.tensor([0, 1, 1, 1, 0, 1, 1, 1, 1]).bool(), torch.arange(9) > 0):
        given, given_keep = weights.clone(), keep.clone()
        got, want = fn(given, given_keep), _softmax_over_kept(weights, keep)
        case = f"weights {tuple(weights.shape)} ({weights.dtype}), keep {keep.int().tolist()}"
        if not torch.equal(given, weights) or not torch.equal(given_keep, keep):
            raise Wrong(f"{case}: your function changed its input in place; leave `weights` and `keep` as they were "
                        "(the notebook compares the weights before and after) and return a new tensor")
        if not isinstance(got, Tensor) or tuple(got.shape) != tuple(weights.shape):
            shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
            raise Wrong(f"{case}: return the weights in the input's shape {tuple(weights.shape)}, with 0 for the "
                        f"evicted keys; got {shape}")
        if close(got, want):
            if got.dtype != weights.dtype:
                raise Wrong(f"{case}: the values are right, but return them in the weights' dtype ({weights.dtype}), "
                            f"got {got.dtype} (the cell below compares with torch.allclose, which refuses mixed "
                            "dtypes)")
            continue
        if close(got, weights * keep):
            raise Wrong("after eviction the weights must sum to 1 again: divide by the kept mass")
        if close(got, want * keep + weights * ~keep) or not close((torch.as_tensor(got) * ~keep).abs().sum(), 0.0):
            raise Wrong("evicted keys must get weight 0")
        if close(got, torch.softmax(weights.masked_fill(~keep, float("-inf")), -1)):
            raise Wrong("these are already probabilities: renormalise them, do not apply softmax to them again")
        raise Wrong(f"{case}: expected w_j / sum of kept w for kept keys and 0 for evicted ones; row 0 should be "
                    f"{[round(x, 4) for x in want[0].tolist()]}, got {[round(x, 4) for x in got[0].double().tolist()]}")


# ----------------------------------------------------------------------------- 4. build: the streaming evaluation loop
def _stream_policy(model, window: int, n_sink: int, extra: int = 0, pin: bool = True):
    """The course's cache rule for the build (original positions): ``extra`` slots more, or no pinned sinks."""
    if not pin:
        return make_policy("window", n_sink + window + extra, model=model)
    name = "streaming" if n_sink else "window"
    return make_policy(name, n_sink + window + extra, sinks=n_sink, positions="original", model=model)


@torch.inference_mode()
def _window_nll_with_course(model, ids: Tensor, window: int, n_sink: int = 0) -> Tensor:
    """AUTOFILL's build: the course's decode loop through its own cache rule."""
    return decode_stream(model, ids, _stream_policy(model, window, n_sink), progress=False).nll


@torch.inference_mode()
def _scored(model, ids: Tensor, policy, shift: int = 1) -> Tensor:
    """NLL [B, T - 1] of the token ``shift`` after each one fed, through the course's cache under ``policy``."""
    cache = model.new_cache(ids.shape[0], policy)
    rows = []
    for t in range(ids.shape[1] - 1):
        logits = model(ids[:, t : t + 1], cache=cache).logits[:, -1].double()
        target = ids[:, t + shift : t + shift + 1]
        rows.append(torch.logsumexp(logits, -1) - logits.gather(-1, target)[:, 0])
    return torch.stack(rows, dim=1)


def _diagnose_stream(model, ids: Tensor, window: int, n_sink: int, got: Tensor, where: str = "") -> str | None:
    """The mistake, as the course's cache rule that gives the same NLL (None when none does)."""
    mistakes = [
        (_scored(model, ids, _stream_policy(model, window, n_sink, extra=1)),
         hint(3, "your cache lets each token see n_sink + window + 1 keys: the new token counts in the budget, so drop "
                 "a slot *before* feeding a token once the cache holds n_sink + window tokens")),
        (_scored(model, ids, _stream_policy(model, window, n_sink), shift=0),
         hint(1, "score the *next* token: the logits of token t predict ids[:, t + 1]")),
    ]
    if n_sink:
        mistakes.append((_scored(model, ids, _stream_policy(model, window, n_sink, pin=False)),
                         hint(3, "the first n_sink tokens are never evicted: drop the oldest token *after* the "
                                 "sinks")))
    prefix = f"{where}; " if where else ""
    return next((prefix + text for nll, text in mistakes if close(got, nll, 1e-6)), None)


@exercise("02.window_stream_nll", "Build exercise (the streaming loop behind the collapse curve)",
          points=6, kind="build", fallback=_window_nll_with_course,
          shortcuts=(decode_stream, exact_stream, evaluate_stream, make_policy, StreamingLLM, PinSinks, SlidingWindow))
def _check_window_stream_nll(fn) -> None:
    ids = torch.randint(0, 53, (2, 24), generator=generator(3))
    for family, window, n_sink in (("gpt2", 8, 0), ("gpt2", 6, 2), ("llama", 5, 3)):
        model = tiny_model(family, seed=3)
        want = _scored(model, ids, _stream_policy(model, window, n_sink))  # the course's cache, the oracle
        with GuardedModel(model) as guarded:
            got = torch.as_tensor(fn(guarded, ids.clone(), window, n_sink))
        if tuple(got.shape) != tuple(want.shape):
            raise Wrong(hint(2, f"return the NLL of every predicted token, [batch, T - 1] = {tuple(want.shape)}, "
                                f"got {tuple(got.shape)}"))
        if any(n != 1 for n in guarded.calls):
            raise Wrong(hint(1, "feed one token per forward call through the cache (your calls got "
                                f"{sorted(set(guarded.calls))} tokens): streaming never recomputes the window"))
        if close(got, want, 1e-6):
            continue
        step = int(((got.double() - want).abs() > 1e-6).any(0).nonzero()[0])
        where = (f"{family}, window {window}, {n_sink} sinks, ids {tuple(ids.shape)}: at prediction {step} expected "
                 f"NLL {[round(x, 4) for x in want[:, step].tolist()]}, got "
                 f"{[round(x, 4) for x in got[:, step].double().tolist()]}")
        raise Wrong(_diagnose_stream(model, ids, window, n_sink, got, where) or hint(
            3, f"{where}: the NLL differs from the course's cache from that prediction on (the cache fills at token "
               f"{n_sink + window})"))
