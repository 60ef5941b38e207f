"""The table of policies (``POLICIES``, one ``PolicyKind`` row per policy, added by ``register`` in the
policy's own file) and the one way the course builds a policy from it (``make_policy``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from course.policies.base import Policy, PositionRule, check_int, check_rule, no_reassignment

__all__ = ["PolicyKind", "POLICIES", "PLACES", "register", "policy_names", "make_policy"]

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
    * ``explorer_sinks``: the cache explorer offers pinned sinks with it (False for the window: a window with
      pinned sinks is StreamingLLM, offered as such).
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
    explorer_sinks: bool = True
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


def make_policy(
    name: str, budget: int | None = None, *, sinks: int | None = None, model=None, recent: int | None = None,
    obs_window: int = 8, kernel: int = 7, pooling: Literal["avg", "max"] = "max",
    positions: PositionRule | None = None, seed: int = 0, quantizer: object | None = None,
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
    * ``quantizer``: a store (``course.storage``, e.g. ``course.quantize.KIVI``) the cache keeps the tokens in; the
      policy only carries it to the cache, which composes the two. Any policy: ``make_policy("full",
      quantizer=KIVI(bits=2))`` is quantization alone, ``make_policy("streaming", 256, quantizer=KIVI(bits=4))``
      both.
    """
    policy = _make_policy(name, budget, sinks=sinks, config=getattr(model, "config", model), recent=recent,
                          obs_window=obs_window, kernel=kernel, pooling=pooling, positions=positions, seed=seed)
    policy.quantizer = quantizer
    return policy


def _make_policy(
    name: str, budget: int | None, *, sinks: int | None, config, recent: int | None, obs_window: int, kernel: int,
    pooling: Literal["avg", "max"], positions: PositionRule | None, seed: int,
) -> Policy:
    """``make_policy`` without the store: the policy itself."""
    if name not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {name!r}")
    kind = POLICIES[name]
    if positions is not None:
        check_rule(positions)
        if positions == "cache" and config is not None and not config.reassigns_positions:
            raise ValueError(no_reassignment(f"policy {name!r} with positions='cache'", config))
    if not kind.bounded:
        return kind.build(None, 0, positions or "original")
    if budget is None:
        raise ValueError(f"policy {name!r} needs a budget (slots per KV head)")
    check_int("budget", budget, 1)
    n_sink = kind.sinks if sinks is None else check_int("sinks", sinks, 0)
    if n_sink >= budget:
        raise ValueError(f"budget must exceed the {n_sink} pinned sinks, got budget={budget}")
    can_reassign = config is None or config.reassigns_positions
    rule: PositionRule = positions or ("cache" if kind.cache_positions and can_reassign else "original")
    return kind.build(budget, n_sink, rule, recent=recent, obs_window=obs_window, kernel=kernel, pooling=pooling,
                      seed=seed)
