"""KV-cache eviction policies: one small class per method behind one interface.

A policy answers one question for every layer: *which cached slots are worth keeping?* It
does so by scoring the slots (higher = keep, ``inf`` = never evict). The cache then

* during decoding, when a new token finds the cache at ``budget`` slots, overwrites the
  slot with the lowest score (per batch row and KV head);
* after a prompt (``KVCache.compress``), keeps the ``prompt_budget`` best-scored slots.

Policies that need attention weights (H2O, SnapKV) say how many query rows they need with
``attention_rows`` and receive them in ``observe``; the model computes weights only then.

Each policy also states its *position rule*:

* ``"original"``: every token keeps the position it had in the stream (what a plain sliding
  window does, and the only option for GPT-2, whose positions are added to the input);
* ``"cache"``: RoPE positions are re-assigned inside the cache (slots 0..n-1), StreamingLLM's
  rule, which lets a model stream far beyond the positions it was trained on.

Budgets count slots per KV head, sinks included: ``StreamingLLM(4, 1020)`` keeps 1024.

Every policy is declared once, as a row of the table ``POLICIES`` (``PolicyKind``: its name, how it is built,
whether it needs attention weights or only compresses a prompt, the sinks it pins by default, where it is shown);
``make_policy``, the command line, the benchmark, the cache explorer and notebook 07 read it.

Build policies with ``make_policy(name, budget, sinks=..., model=...)``: given the model it picks
the position rule its family allows and refuses what the model cannot do, so a policy it returns is
never refused by the model's cache. Policies read the cache's per-layer slots (``LayerCache``) but
never import the cache module at run time: the dependency runs policy -> cache -> attention.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from course.kvcache import LayerCache
    from course.quantize import KIVI

__all__ = [
    "Policy",
    "FullCache",
    "SlidingWindow",
    "PinSinks",
    "StreamingLLM",
    "H2O",
    "SnapKV",
    "RandomEviction",
    "accumulate_attention",
    "make_policy",
    "PolicyKind",
    "POLICIES",
    "PLACES",
    "register",
    "policy_names",
    "pinned",
]

PositionRule = Literal["original", "cache"]
INF = math.inf  # pinned: never evicted
PROTECTED = 1e9  # kept before any scored slot, but evicted before a pinned sink (plus position: oldest first)


def _check_int(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _check_rule(positions: str) -> PositionRule:
    if positions not in ("original", "cache"):
        raise ValueError(f"positions must be 'original' or 'cache', got {positions!r}")
    return positions  # type: ignore[return-value]


def group_mean(weights: Tensor, kv_heads: int) -> Tensor:
    """Average per-query-head numbers within each GQA group: [B, H, ...] -> [B, H_kv, ...].

    Query heads h*G .. h*G+G-1 share KV head h (G = H / H_kv), as in transformers' repeat_kv.
    """
    b, h = weights.shape[:2]
    return weights.reshape(b, kv_heads, h // kv_heads, *weights.shape[2:]).mean(dim=2)


def accumulate_attention(layer: LayerCache, weights: Tensor) -> None:
    """Add the attention each cached key received ([B, H, rows, S]) to the layer's running sums
    (``layer.stat("attention")``, [B, H_kv, S]), averaged over the query heads of each GQA group."""
    acc = layer.stat("attention")
    acc += group_mean(weights.float(), layer.keys.shape[1]).sum(dim=2)


class Policy:
    """The interface. Subclasses override ``scores`` and, when they need attention, ``observe``."""

    name = "policy"
    budget: int | None = None  # slots per KV head while decoding (None: never evict)
    position_rule: PositionRule = "original"
    is_static = False  # the choice depends on positions only (the exact evaluator applies)
    quantizer: KIVI | None = None  # how the kept tokens are stored (None: in the model's dtype)

    def stored(self, quantizer: KIVI | None) -> Policy:
        """This policy with its kept tokens stored by ``quantizer`` (``course.quantize.KIVI``); returns self.

        A quantized store changes a token's numbers as it ages out of the full-precision residual; a static policy
        stays static: the exact evaluator cuts its chunks where no key group leaves the residual inside a chunk
        (``KIVI.chunk_starts``)."""
        self.quantizer = quantizer
        return self

    @property
    def prompt_budget(self) -> int | None:
        """Slots kept when a prompt is compressed (``KVCache.compress``)."""
        return self.budget

    def scores(self, layer: LayerCache, seen: int | Tensor) -> Tensor:
        """Keep-priority of every cached slot: [B, H_kv, S] float; inf = never evict. ``seen``: the tokens the
        stream has had (in a left-padded batch, each row's: a [B, 1, 1] tensor, ``KVCache.row_seen``)."""
        raise NotImplementedError

    def attention_rows(self, n_queries: int) -> int:
        """How many of the last query rows' attention weights ``observe`` needs (0: none)."""
        return 0

    def observe(self, layer: LayerCache, weights: Tensor, seen: int) -> None:
        """Receive attention weights [B, H, rows, S] over the cached slots (after the update)."""

    def visible(self, q_pos: Tensor, k_pos: Tensor, slots: int | None = None) -> Tensor:
        """Static policies: may a query at q_pos see a key at k_pos (broadcasting bool)?"""
        raise NotImplementedError(f"{self.name} is not decided by positions alone")

    def pinned(self, k_pos: Tensor) -> Tensor:
        """Which keys are pinned sinks (bool, same shape as k_pos)."""
        return torch.zeros_like(k_pos, dtype=torch.bool)

    def cache_ranks(self, k_pos: Tensor) -> Tensor:
        """Positions of the cached keys under the cache rule: each slot's rank among the cached original
        positions, 0 for the oldest ([B, H_kv, S] long -> [B, H_kv, S] long; slots are not in token order)."""
        return k_pos.argsort(dim=-1).argsort(dim=-1)

    def check_model(self, config) -> None:
        """Refuse combinations a model (its ``ModelConfig``) cannot do: GPT-2 cannot re-assign positions."""
        if self.position_rule == "cache" and not config.reassigns_positions:
            raise ValueError(_no_reassignment(self.label, config))

    @property
    def label(self) -> str:
        """A short name for tables and plots."""
        return self.name

    def __repr__(self) -> str:
        return self.label if self.quantizer is None else f"{self.label}@{self.quantizer.label}"


class FullCache(Policy):
    """Keep everything: the dense baseline. Memory grows with every token."""

    name = "full"
    is_static = True

    def scores(self, layer: LayerCache, seen: int) -> Tensor:
        return layer.positions[:, :, : layer.length].float()  # (never called: no budget)

    def visible(self, q_pos: Tensor, k_pos: Tensor, slots: int | None = None) -> Tensor:
        if slots is None:
            return torch.ones_like(k_pos, dtype=torch.bool) & torch.ones_like(q_pos, dtype=torch.bool)
        return q_pos - k_pos < slots


class SlidingWindow(Policy):
    """Keep the ``window`` most recent tokens: evict the oldest (a ring buffer)."""

    name = "window"
    is_static = True

    def __init__(self, window: int, positions: PositionRule = "original") -> None:
        self.window = _check_int("window", window, 1)
        self.budget = window
        self.position_rule = _check_rule(positions)

    def scores(self, layer: LayerCache, seen: int) -> Tensor:
        return layer.positions[:, :, : layer.length].float()

    def visible(self, q_pos: Tensor, k_pos: Tensor, slots: int | None = None) -> Tensor:
        return q_pos - k_pos < (self.window if slots is None else slots)

    @property
    def label(self) -> str:
        return f"window({self.window})"


class PinSinks(Policy):
    """Wrap any policy so that the first ``n_sink`` tokens of the stream are never evicted.

    The sinks count against the wrapped policy's budget: ``PinSinks(H2O(60, 40), 4)`` still
    keeps 100 slots, 4 of them sinks. It also works as a plug-in for SnapKV and random eviction.
    """

    def __init__(self, inner: Policy, n_sink: int = 4, positions: PositionRule | None = None, start: int = 0) -> None:
        self.inner = inner
        self.n_sink = _check_int("n_sink", n_sink, 0)
        self.start = _check_int("start", start, 0)
        if inner.prompt_budget is not None and n_sink >= inner.prompt_budget:
            raise ValueError(f"n_sink must be smaller than the budget ({inner.prompt_budget}), got {n_sink}")
        self.budget = inner.budget
        self.position_rule = inner.position_rule if positions is None else _check_rule(positions)
        if start and self.position_rule == "cache":
            raise ValueError("pinning tokens other than the first (start > 0) needs positions='original'")
        self.is_static = inner.is_static
        self.name = f"{inner.name}+sinks"

    @property
    def prompt_budget(self) -> int | None:
        return self.inner.prompt_budget

    def pinned(self, k_pos: Tensor) -> Tensor:
        return (k_pos >= self.start) & (k_pos < self.start + self.n_sink)

    def scores(self, layer: LayerCache, seen: int) -> Tensor:
        s = self.inner.scores(layer, seen)
        return s.masked_fill(self.pinned(layer.positions[:, :, : layer.length]), INF)

    def attention_rows(self, n_queries: int) -> int:
        return self.inner.attention_rows(n_queries)

    def observe(self, layer: LayerCache, weights: Tensor, seen: int) -> None:
        self.inner.observe(layer, weights, seen)

    def visible(self, q_pos: Tensor, k_pos: Tensor, slots: int | None = None) -> Tensor:
        if self.budget is None:
            return self.inner.visible(q_pos, k_pos)
        # The static inner policy is a sliding window: the cache holds the pinned tokens that have
        # arrived (p_q of them) and the budget - p_q most recent others. A key is visible if fewer
        # than that many unpinned tokens came after it.
        s, n = self.start, self.n_sink
        p_q = (q_pos - s + 1).clamp(0, n)
        pinned_after_k = (torch.minimum(q_pos, torch.full_like(q_pos, s + n - 1))
                          - torch.maximum(k_pos + 1, torch.full_like(k_pos, s)) + 1).clamp(0, n)
        return self.pinned(k_pos) | (q_pos - k_pos - pinned_after_k < self.budget - p_q)

    @property
    def label(self) -> str:
        where = f" at {self.start}" if self.start else ""
        return f"{self.inner.label}+{self.n_sink} sinks{where}"


class StreamingLLM(PinSinks):
    """Xiao et al. 2023: ``n_sink`` attention sinks + the ``window`` most recent tokens.

    Cache = [sinks | recent]; positions re-assigned inside the cache by default (RoPE models).
    """

    def __init__(self, n_sink: int = 4, window: int = 1020, positions: PositionRule = "cache") -> None:
        _check_int("window", window, 1)
        super().__init__(SlidingWindow(_check_int("n_sink", n_sink, 0) + window), n_sink, positions)
        self.window = window
        self.name = "streaming"

    @property
    def label(self) -> str:
        return f"streaming({self.n_sink}+{self.window})"


class H2O(Policy):
    """Zhang et al. 2023 (arXiv 2306.14048), Heavy-Hitter Oracle: keep the tokens that received the most attention.

    Every KV head accumulates the attention each cached key has received, summed over the queries and
    averaged over the query heads of its GQA group. The paper (and its reference code, whose
    ``_update_hh_score`` adds each step's attention to a running score) ranks keys by these **raw sums**,
    the default here (``make_policy("h2o")``). Raw sums favour old tokens: key ``j`` has been seen by
    ``seen - j`` queries, the newest key by one. ``normalize=True`` is the variant ``"h2o-mean"``, which
    divides by that count (mean attention per query that could see the key), as NVIDIA kvpress's
    ObservedAttentionPress does. The ``recent`` newest tokens are kept before any heavy hitter;
    budget = heavy + recent slots per KV head.
    """

    def __init__(self, heavy: int, recent: int, positions: PositionRule = "original", normalize: bool = False) -> None:
        self.heavy = _check_int("heavy", heavy, 0)
        self.recent = _check_int("recent", recent, 0)
        self.budget = _check_int("heavy + recent", heavy + recent, 1)
        self.position_rule = _check_rule(positions)
        self.normalize = bool(normalize)
        self.name = "h2o-mean" if self.normalize else "h2o"

    def attention_rows(self, n_queries: int) -> int:
        return n_queries

    def observe(self, layer: LayerCache, weights: Tensor, seen: int) -> None:
        accumulate_attention(layer, weights)

    def scores(self, layer: LayerCache, seen: int) -> Tensor:
        pos = layer.positions[:, :, : layer.length]
        s = layer.stat("attention")
        if self.normalize:
            s = s / (seen - pos).clamp(min=1).float()  # queries that could see each key
        return torch.where(pos >= seen - self.recent, PROTECTED + pos, s)

    @property
    def label(self) -> str:
        return f"{self.name}({self.heavy}+{self.recent})"


class SnapKV(Policy):
    """Li et al. 2024: compress the prompt once, with votes from its last queries.

    The last ``obs_window`` queries of the prompt vote, per head, for the earlier keys they
    attend to; votes are pooled over neighbouring positions (``kernel``, avg or max) so whole
    spans survive, averaged within each GQA group, and every KV head keeps its
    ``capacity - obs_window`` best prefix slots plus the observation window itself.
    Decoding then proceeds without eviction.
    """

    name = "snapkv"

    def __init__(
        self, capacity: int, obs_window: int = 8, kernel: int = 7, pooling: Literal["avg", "max"] = "max",
        positions: PositionRule = "original",
    ) -> None:
        self.capacity = _check_int("capacity", capacity, 2)
        self.obs_window = _check_int("obs_window", obs_window, 1)
        if obs_window >= capacity:
            raise ValueError(f"obs_window must be smaller than capacity ({capacity}), got {obs_window}")
        self.kernel = _check_int("kernel", kernel, 1)
        if kernel % 2 == 0:
            raise ValueError(f"kernel must be odd (the pool is centred), got {kernel}")
        if pooling not in ("avg", "max"):
            raise ValueError(f"pooling must be 'avg' or 'max', got {pooling!r}")
        self.pooling = pooling
        self.position_rule = _check_rule(positions)
        self.budget = None  # no eviction while decoding

    @property
    def prompt_budget(self) -> int:
        return self.capacity

    def attention_rows(self, n_queries: int) -> int:
        return min(self.obs_window, n_queries) if n_queries > 1 else 0

    def observe(self, layer: LayerCache, weights: Tensor, seen: int) -> None:
        pos = layer.positions[:, :, : layer.length]
        real = pos >= 0  # a left-padded batch keeps its padding at position -1, before the prompt (course.kvcache)
        if not bool(((pos[..., 1:] > pos[..., :-1]) | ~real[..., :-1]).all()):
            raise RuntimeError("SnapKV compresses a prompt once, before any eviction; this cache was already evicted")
        votes = weights.float().sum(dim=2)  # [B, H, S]: attention from the window's queries
        n_prefix = votes.shape[-1] - weights.shape[2]
        pooled = self.pool(votes[..., :n_prefix], None if bool(real.all()) else real[:, :1, :n_prefix])
        stat = layer.stat("snapkv")
        stat[..., :n_prefix] = group_mean(pooled, layer.keys.shape[1])
        stat[..., n_prefix:] = PROTECTED + pos[..., n_prefix:]  # the observation window itself is kept

    def pool(self, votes: Tensor, real: Tensor | None = None) -> Tensor:
        """Pool votes over neighbouring positions: [B, H, S] -> [B, H, S] (stride 1, same size).

        ``real`` ([B, 1, S] bool): in a left-padded batch, which slots hold tokens. Padding then counts as beyond
        the prompt's edge, as if each row ran alone (its votes are zero, which max pooling ignores anyway)."""
        b, h, s = votes.shape
        if s == 0:  # a prompt no longer than the observation window: nothing before it to pool
            return votes
        x = votes.reshape(b * h, 1, s)
        pad = self.kernel // 2
        if self.pooling == "avg" and real is not None:  # the sum over real neighbours / their number
            r = real.expand(b, h, s).reshape(b * h, 1, 1, s).to(x.dtype)
            total = F.avg_pool2d((x * r.view_as(x))[:, :, None], (1, self.kernel), stride=1, padding=(0, pad),
                                 divisor_override=1)
            y = total / F.avg_pool2d(r, (1, self.kernel), stride=1, padding=(0, pad), divisor_override=1)
        elif self.pooling == "avg":
            y = F.avg_pool1d(x, self.kernel, stride=1, padding=pad, count_include_pad=False)
        else:
            y = F.max_pool1d(x, self.kernel, stride=1, padding=pad)
        return y.reshape(b, h, s)

    def scores(self, layer: LayerCache, seen: int) -> Tensor:
        return layer.stat("snapkv")

    @property
    def label(self) -> str:
        return f"snapkv({self.capacity})"


class RandomEviction(Policy):
    """Evict a uniformly random slot: the floor any policy should beat."""

    name = "random"

    def __init__(self, budget: int, seed: int = 0, positions: PositionRule = "original") -> None:
        self.budget = _check_int("budget", budget, 1)
        self.position_rule = _check_rule(positions)
        self.generator = torch.Generator().manual_seed(seed)

    def scores(self, layer: LayerCache, seen: int) -> Tensor:
        shape = layer.positions[:, :, : layer.length].shape
        return torch.rand(shape, generator=self.generator).to(layer.keys.device)

    @property
    def label(self) -> str:
        return f"random({self.budget})"


# ----------------------------------------------------------------------------- the table of policies
PLACES = ("bench", "explorer", "compare")  # where a policy is shown beside the others (see ``PolicyKind.shown_in``)


@dataclass(frozen=True)
class PolicyKind:
    """One row of the table of policies: everything the course needs to know about a policy, declared once.

    * ``build(budget, sinks, rule, **options)``: the policy for a budget (slots per KV head, sinks included),
      ``sinks`` first tokens to pin (``pinned`` wraps any policy in ``PinSinks``), a position rule, and
      ``make_policy``'s options (``recent``, ``obs_window``, ``kernel``, ``pooling``, ``seed``; ignore the rest).
    * ``needs_weights``: it scores slots from attention weights (``observe``); the model computes them for it.
    * ``prefill_only``: it compresses the prompt once and never evicts while decoding (SnapKV), so it cannot
      bound a stream (``stream`` does not offer it).
    * ``sinks``: first tokens pinned unless the caller says otherwise (StreamingLLM: 4).
    * ``bounded``: False for the full cache, which keeps everything and takes no budget.
    * ``cache_positions``: it re-assigns positions inside the cache where the model allows it (StreamingLLM).
    * ``shown_in``: where it is shown beside the others: ``bench`` (speed and memory), ``explorer`` (the cache
      explorer's dropdown), ``compare`` (notebook 07's contenders). Every CLI command that takes ``--policy``
      offers it in any case."""

    name: str
    build: Callable[..., Policy]
    needs_weights: bool = False
    prefill_only: bool = False
    sinks: int = 0
    bounded: bool = True
    cache_positions: bool = False
    shown_in: frozenset[str] = frozenset(PLACES)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        unknown = set(self.shown_in) - set(PLACES)
        if unknown:
            raise ValueError(f"shown_in must hold only {', '.join(PLACES)}, got {sorted(unknown)}")


POLICIES: dict[str, PolicyKind] = {}


def register(kind: PolicyKind) -> PolicyKind:
    """Add a row to the table of policies (a name may be registered once); returns it."""
    if kind.name in POLICIES:
        raise ValueError(f"policy {kind.name!r} is registered already")
    POLICIES[kind.name] = kind
    return kind


def policy_names(shown_in: str | None = None, *, streams: bool | None = None,
                 needs_weights: bool | None = None) -> tuple[str, ...]:
    """The registered policies, in the order registered: all of them, or those shown in ``shown_in`` (one of
    ``PLACES``), those that can bound a stream (``streams=True``), those that need attention weights."""
    if shown_in is not None and shown_in not in PLACES:
        raise ValueError(f"shown_in must be one of {', '.join(PLACES)}, got {shown_in!r}")
    return tuple(k.name for k in POLICIES.values()
                 if (shown_in is None or shown_in in k.shown_in)
                 and (streams is None or streams != k.prefill_only)
                 and (needs_weights is None or needs_weights == k.needs_weights))


def pinned(policy: Policy, sinks: int) -> Policy:
    """``policy`` with its first ``sinks`` tokens pinned (itself when ``sinks`` is 0)."""
    return PinSinks(policy, sinks) if sinks else policy


def _h2o(budget: int, rule: PositionRule, recent: int | None, normalize: bool) -> H2O:
    r = budget // 2 if recent is None else _check_int("recent", recent, 0)
    if r > budget:
        raise ValueError(f"recent must be at most the budget ({budget}), got {r}")
    return H2O(budget - r, r, rule, normalize=normalize)


register(PolicyKind("full", lambda budget, sinks, rule, **o: FullCache(), bounded=False,
                    shown_in=frozenset({"bench"})))
register(PolicyKind("window", lambda budget, sinks, rule, **o: pinned(SlidingWindow(budget, rule), sinks)))
register(PolicyKind("streaming", lambda budget, sinks, rule, **o: StreamingLLM(sinks, budget - sinks, rule), sinks=4,
                    cache_positions=True))
register(PolicyKind(
    "h2o", lambda budget, sinks, rule, recent=None, **o: pinned(_h2o(budget, rule, recent, False), sinks),
    needs_weights=True))
register(PolicyKind(
    "h2o-mean", lambda budget, sinks, rule, recent=None, **o: pinned(_h2o(budget, rule, recent, True), sinks),
    needs_weights=True, shown_in=frozenset({"compare"})))
register(PolicyKind(
    "snapkv", lambda budget, sinks, rule, obs_window=8, kernel=7, pooling="max", **o:
    pinned(SnapKV(budget, min(obs_window, budget - 1), kernel, pooling, rule), sinks),
    needs_weights=True, prefill_only=True))
register(PolicyKind(
    "random", lambda budget, sinks, rule, seed=0, **o: pinned(RandomEviction(budget, seed, rule), sinks),
    shown_in=frozenset()))


def _no_reassignment(what: str, config) -> str:
    return (
        f"{what} re-assigns positions inside the cache, which {config.name} (GPT-2 family) cannot do: its positions are "
        "learned embeddings added to the input, so every cached key and value already carries its original "
        "position and changing it would mean recomputing them. Use positions='original' (streams of at most "
        f"{config.max_positions} tokens), or a RoPE model."
    )


def make_policy(
    name: str, budget: int | None = None, *, sinks: int | None = None, model=None, recent: int | None = None,
    obs_window: int = 8, kernel: int = 7, pooling: Literal["avg", "max"] = "max",
    positions: PositionRule | None = None, seed: int = 0, quantizer: KIVI | None = None,
) -> Policy:
    """The one way the course builds a policy: a name and a total budget (slots per KV head, sinks included).

    * ``name``: a row of the table of policies (``POLICIES``; ``register`` adds one, see docs/add-a-policy.md).

    * ``sinks``: first tokens pinned for any policy; StreamingLLM pins 4 unless told otherwise
      (``sinks=0`` gives it none: a window with positions inside the cache).
    * ``model`` (a course model or its ``ModelConfig``): picks the position rule its family allows,
      the cache rule for StreamingLLM where positions can be re-assigned (RoPE), original positions
      everywhere else, and refuses ``positions='cache'`` where they cannot (GPT-2).
    * H2O splits its budget into ``budget - recent`` heavy hitters and ``recent`` recent tokens,
      ``recent = budget // 2`` unless given. ``"h2o"`` ranks keys by their raw accumulated attention (the
      paper's rule); ``"h2o-mean"`` divides it by the number of queries that saw each key (a variant, as in
      kvpress's ObservedAttentionPress).
    * SnapKV: ``obs_window`` (at most budget - 1), ``kernel``, ``pooling``.
    * ``quantizer``: how the kept tokens are stored (``course.quantize.KIVI``), any policy: ``make_policy("full",
      quantizer=KIVI(bits=2))`` is quantization alone, ``make_policy("streaming", 256, quantizer=KIVI(bits=4))``
      both.
    """
    return _make_policy(name, budget, sinks=sinks, config=getattr(model, "config", model), recent=recent,
                        obs_window=obs_window, kernel=kernel, pooling=pooling, positions=positions,
                        seed=seed).stored(quantizer)


def _make_policy(
    name: str, budget: int | None, *, sinks: int | None, config, recent: int | None, obs_window: int, kernel: int,
    pooling: Literal["avg", "max"], positions: PositionRule | None, seed: int,
) -> Policy:
    """``make_policy`` without the store: the policy itself."""
    if name not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {name!r}")
    kind = POLICIES[name]
    if positions is not None:
        _check_rule(positions)
        if positions == "cache" and config is not None and not config.reassigns_positions:
            raise ValueError(_no_reassignment(f"policy {name!r} with positions='cache'", config))
    if not kind.bounded:
        return kind.build(None, 0, positions or "original")
    if budget is None:
        raise ValueError(f"policy {name!r} needs a budget (slots per KV head)")
    _check_int("budget", budget, 1)
    n_sink = kind.sinks if sinks is None else _check_int("sinks", sinks, 0)
    if n_sink >= budget:
        raise ValueError(f"budget must exceed the {n_sink} pinned sinks, got budget={budget}")
    can_reassign = config is None or config.reassigns_positions
    rule: PositionRule = positions or ("cache" if kind.cache_positions and can_reassign else "original")
    return kind.build(budget, n_sink, rule, recent=recent, obs_window=obs_window, kernel=kernel, pooling=pooling,
                      seed=seed)
