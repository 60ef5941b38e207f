"""Streaming a long text through a bounded cache, and measuring what it costs.

Three ways to score a stream token by token (NLL of each next token):

* ``decode_stream``: the reference. One token at a time through the cache; the policy
  evicts as it goes. Works for every policy (H2O and SnapKV included).
* ``exact_stream``: the fast, exact evaluator for policies decided by positions alone
  (full, sliding window, sinks + window). Chunks of tokens run in one masked forward; each
  query is masked to exactly the keys the decode loop would have cached when it was decoded,
  and, under StreamingLLM's cache position rule, sinks are scored at their in-cache distance.
  Same NLL as ``decode_stream`` (tests: <= 1e-4), many times faster.
* ``recompute_stream``: the dense sliding-window *recomputation* baseline (StreamingLLM's
  oracle): for each token, a fresh forward over the last ``window`` tokens, positions 0..W-1.
  Good quality, quadratic cost.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from course.kvcache import KVCache
from course.models.base import CausalLM
from course.policies import FullCache, Policy
from course.progress import progress_bar
from course.timing import synchronize

__all__ = ["StreamResult", "decode_stream", "exact_stream", "recompute_nll", "recompute_stream", "evaluate_stream",
           "next_token_nll"]


@dataclass
class StreamResult:
    """Per-token results of one stream.

    nll[b, t] is the negative log-likelihood of token t+1 given tokens 0..t (as the policy let
    the model see them): [B, T-1]. ``cache_bytes[t]`` is the cache size after token t.
    ``fill`` is the first index t at which the cache no longer holds every earlier token.
    """

    label: str
    nll: Tensor
    cache_bytes: list[int]
    seconds: float
    fill: int | None
    extra: dict = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return self.nll.shape[1] + 1

    def _span(self, start: int, end: int | None) -> Tensor:
        """NLL of the predictions made at positions start..end-1: [B, n], n >= 1."""
        span = self.nll[:, start:end]
        if span.numel() == 0:
            raise ValueError(f"no scored tokens between {start} and {end} (stream of {self.tokens} tokens)")
        return span.double()

    def ppl(self, start: int = 0, end: int | None = None) -> float:
        """Perplexity exp(mean NLL) over predictions made at positions start..end-1 (all rows)."""
        return math.exp(self._span(start, end).mean().item())

    def ppl_per_stream(self, start: int = 0, end: int | None = None) -> list[float]:
        """Perplexity of each row (stream) separately over predictions start..end-1: [B] floats."""
        return self._span(start, end).mean(dim=1).exp().tolist()

    @property
    def ppl_after_fill(self) -> float | None:
        """Perplexity over predictions made once the cache has started evicting (None if it never did)."""
        if self.fill is None or self.fill >= self.nll.shape[1]:
            return None
        return self.ppl(self.fill)

    @property
    def max_cache_bytes(self) -> int:
        return max(self.cache_bytes) if self.cache_bytes else 0

    def summary(self) -> dict:
        return {
            "policy": self.label, "tokens": self.tokens, "ppl": self.ppl(), "ppl_after_fill": self.ppl_after_fill,
            "max_cache_bytes": self.max_cache_bytes, "seconds": self.seconds, **self.extra,
        }


def _as_batch(ids: Tensor) -> Tensor:
    """[B, T] ids with T >= 2 (a [T] stream gets a batch dimension)."""
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[1] < 2:
        raise ValueError(f"ids must be [batch, tokens] with at least 2 tokens, got shape {tuple(ids.shape)}")
    return ids


def _check_ids(ids: Tensor, model: CausalLM, what: str) -> Tensor:
    """[B, T] ids that fit the model's positions (refused before any work otherwise), on its device."""
    ids = _as_batch(ids)
    model.config.check_tokens(ids.shape[1], what)
    return ids.to(model.device)


def _fill_index(policy: Policy, n_tokens: int) -> int | None:
    """First token that attends to fewer than all earlier tokens (the window is full)."""
    budget = policy.budget
    return budget if budget is not None and budget < n_tokens else None


def next_token_nll(logits: Tensor, targets: Tensor) -> Tensor:
    """logits [B, T, V], targets [B, T] -> NLL [B, T] (at least float32).

    -log softmax(z)_y = logsumexp(z) - z_y: the same as cross-entropy, without the [B, T, V]
    log-probabilities (three times faster on a CPU for SmolLM2's 49K-token vocabulary)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.logsumexp(logits, dim=-1) - logits.gather(-1, targets[..., None])[..., 0]


def _progress(total: int, desc: str, enabled: bool):
    return progress_bar(total=total, desc=desc, unit="tok", enabled=enabled)


@torch.inference_mode()
def decode_stream(model: CausalLM, ids: Tensor, policy: Policy | None = None, progress: bool = True,
                  inspect: Callable[[KVCache], dict] | None = None) -> StreamResult:
    """Decode ``ids`` ([B, T] or [T]) one token at a time through a cache managed by ``policy``.

    ``inspect(cache)``, if given, is called on the final cache; its dict goes to ``result.extra``."""
    ids = _check_ids(ids, model, "decode_stream")
    policy = policy or FullCache()
    cache = model.new_cache(ids.shape[0], policy)
    n = ids.shape[1]
    nll = torch.empty(ids.shape[0], n - 1, device=ids.device, dtype=torch.promote_types(model.dtype, torch.float32))
    sizes = []
    start = time.perf_counter()
    with _progress(n - 1, f"decode {policy!r}", progress) as bar:
        for t in range(n - 1):
            logits = model(ids[:, t : t + 1], cache=cache).logits
            nll[:, t] = next_token_nll(logits, ids[:, t + 1 : t + 2])[:, 0]
            sizes.append(cache.nbytes)
            bar.update(1)
    synchronize(ids.device)
    extra = inspect(cache) if inspect is not None else {}
    return StreamResult(repr(policy), nll.cpu(), sizes, time.perf_counter() - start, _fill_index(policy, n), extra)


@torch.inference_mode()
def exact_stream(
    model: CausalLM, ids: Tensor, policy: Policy | None = None, chunk: int = 256, progress: bool = True,
    inspect: Callable[[KVCache], dict] | None = None,
) -> StreamResult:
    """The exact fast evaluator: the NLL ``decode_stream`` would give, computed chunk by chunk.

    Only for policies decided by positions alone (``policy.is_static``: full, window, sinks + window). With a
    quantized store (``policy.quantizer``) chunks are also cut where a key group leaves the residual
    (``KIVI.chunk_starts``), and the bytes of each token are those the store holds at the end of its chunk.
    ``inspect(cache)``, if given, is called on the final cache (which holds what the decode loop's would); its dict
    goes to ``result.extra``.
    """
    ids = _check_ids(ids, model, "exact_stream")
    policy = policy or FullCache()
    if not policy.is_static:
        raise ValueError(f"exact_stream needs a policy decided by positions alone; {policy.label} is not: use decode_stream")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    cache = model.new_cache(ids.shape[0], policy, chunks="stream")
    n = ids.shape[1]
    pieces, sizes = [], []
    start = time.perf_counter()
    cuts = set(range(0, n - 1, chunk)) | set(policy.quantizer.chunk_starts(n - 1) if policy.quantizer else [])
    starts = sorted(cuts)
    with _progress(n - 1, f"exact {policy!r}", progress) as bar:
        for c0, c1 in zip(starts, starts[1:] + [n - 1]):
            logits = model(ids[:, c0:c1], cache=cache).logits
            pieces.append(next_token_nll(logits, ids[:, c0 + 1 : c1 + 1]))
            cache.compress()
            if policy.quantizer is None:
                sizes.extend(_bytes_after(cache, t, policy.budget) for t in range(c0, c1))
            else:
                sizes.extend([cache.nbytes] * (c1 - c0))
            bar.update(c1 - c0)
    synchronize(ids.device)
    nll = torch.cat(pieces, dim=1).cpu()
    extra = inspect(cache) if inspect is not None else {}
    return StreamResult(repr(policy), nll, sizes, time.perf_counter() - start, _fill_index(policy, n), extra)


def _bytes_after(cache, t: int, budget: int | None) -> int:
    """Cache bytes the decode loop would hold after token t (t + 1 tokens, capped at the budget)."""
    per_slot = cache.nbytes // max(cache.n_slots, 1)
    slots = t + 1 if budget is None else min(t + 1, budget)
    return per_slot * slots


@torch.inference_mode()
def recompute_nll(model: CausalLM, ids: Tensor, window: int, targets: Sequence[int], batch: int = 16,
                  progress: bool = True) -> Tensor:
    """Dense sliding-window recomputation at chosen positions: the NLL of token t+1 predicted by a fresh
    forward over tokens t-window+1 .. t (at positions 0..window-1), for every row of ``ids`` [B, T] and
    every t in ``targets`` (each >= window - 1). Returns [B, len(targets)]; ``batch`` windows run at once.

    The oracle costs a whole forward of ``window`` tokens per prediction; evaluating it at a sample of
    positions (e.g. every 8th) and comparing other policies at the same positions keeps a comparison
    exact and affordable."""
    ids = _as_batch(ids).to(model.device)
    if window < 1 or batch < 1:
        raise ValueError(f"window and batch must be >= 1, got window={window}, batch={batch}")
    model.config.check_tokens(window, "the recomputation window")  # each window restarts at position 0
    targets = list(targets)
    n = ids.shape[1]
    if not targets or min(targets) < window - 1 or max(targets) > n - 2:
        raise ValueError(f"targets must be positions between window - 1 = {window - 1} and {n - 2}, got "
                         f"{targets[:1] + targets[-1:] if targets else targets}")
    jobs = [(b, i, t) for b in range(ids.shape[0]) for i, t in enumerate(targets)]
    nll = torch.zeros(ids.shape[0], len(targets), device=ids.device, dtype=torch.promote_types(model.dtype, torch.float32))
    with _progress(len(jobs), f"recompute w={window}", progress) as bar:
        for j0 in range(0, len(jobs), batch):
            part = jobs[j0 : j0 + batch]
            windows = torch.stack([ids[b, t - window + 1 : t + 1] for b, _, t in part])  # [k, window]
            nexts = torch.stack([ids[b, t + 1 : t + 2] for b, _, t in part])  # [k, 1]
            rows, cols, _ = zip(*part)
            nll[list(rows), list(cols)] = next_token_nll(model(windows, logits_to_keep=1).logits, nexts)[:, 0]  # last predicts t+1
            bar.update(len(part))
    return nll.cpu()


@torch.inference_mode()
def recompute_stream(
    model: CausalLM, ids: Tensor, window: int, batch: int = 1, progress: bool = True, start: int = 0
) -> StreamResult:
    """Dense sliding-window recomputation: token t is predicted by a fresh forward over the last
    ``window`` tokens (t-window+1 .. t) at positions 0..window-1. ``batch`` windows run at once.
    The stream may be longer than the model's positions (each window restarts at 0); the window may not.

    Predictions before the window fills come from one causal forward over the prefix (that is
    what a fresh forward would give). ``start`` skips the predictions before it (for timing).
    """
    ids = _as_batch(ids).to(model.device)
    if ids.shape[0] != 1:
        raise ValueError("recompute_stream takes a single stream (batch dimension 1)")
    if window < 1 or batch < 1:
        raise ValueError(f"window and batch must be >= 1, got window={window}, batch={batch}")
    model.config.check_tokens(window, "recompute_stream's window")  # each window restarts at position 0
    n = ids.shape[1]
    nll = torch.zeros(1, n - 1, dtype=torch.promote_types(model.dtype, torch.float32))
    t0 = time.perf_counter()
    first = max(start, window - 1)
    if start < window - 1:
        m = min(window - 1, n - 1)
        nll[:, :m] = next_token_nll(model(ids[:, :m]).logits, ids[:, 1 : m + 1]).cpu()
    if first < n - 1:
        nll[:, first:] = recompute_nll(model, ids, window, range(first, n - 1), batch, progress)
    synchronize(ids.device)
    sizes = [model.cache_bytes_per_token * min(t + 1, window) for t in range(n - 1)]
    fill = window if window < n else None
    return StreamResult(f"recompute({window})", nll, sizes, time.perf_counter() - t0, fill)


def evaluate_stream(
    model: CausalLM, ids: Tensor, policy: Policy | None = None, method: str = "auto", progress: bool = True,
    inspect: Callable[[KVCache], dict] | None = None,
) -> StreamResult:
    """Score a stream under a policy: ``exact`` for position-only policies, else ``decode``."""
    policy = policy or FullCache()
    if method not in ("auto", "exact", "decode"):
        raise ValueError(f"method must be 'auto', 'exact' or 'decode', got {method!r}")
    if inspect is None and (method == "exact" or (method == "auto" and policy.is_static)):
        return exact_stream(model, ids, policy, progress=progress)
    return decode_stream(model, ids, policy, progress=progress, inspect=inspect)
