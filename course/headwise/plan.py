"""What a head-wise cache is told: per layer, *parts* (``Part``: a set of KV heads and the policy that manages
them), the whole plan (``HeadPlan``, checked to cover every KV head of every layer exactly once) and the policy
object that carries it wherever a policy goes (``HeadwisePolicy``: ``model.new_cache``, ``compress_prompts``, the
evaluators' ``policy_for``).

Nothing here holds slots: the cache that follows the plan is ``course.headwise.cache.HeadwiseCache``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from course.policies import Policy

__all__ = ["Part", "HeadPlan", "HeadwisePolicy", "Allocator"]

# A prompt allocator (Ada-KV): a layer's keep-priorities [B, H_kv, S] -> which slots each head keeps [B, H_kv, S] bool
Allocator = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class Part:
    """A set of KV heads of one layer (indices into 0..H_kv-1, kept sorted) managed by one policy: they are held
    together in one one-layer ``KVCache``, so they always hold the same number of slots."""

    kv_heads: tuple[int, ...]
    policy: Policy

    def __post_init__(self) -> None:
        heads = tuple(sorted(int(h) for h in self.kv_heads))
        if not heads:
            raise ValueError("a Part needs at least one KV head (kv_heads is empty)")
        if len(set(heads)) != len(heads):
            raise ValueError(f"kv_heads repeats a head: {self.kv_heads}")
        if not isinstance(self.policy, Policy) or isinstance(self.policy, HeadwisePolicy):
            raise TypeError(f"a Part's policy must be a course Policy (not a HeadwisePolicy), got {self.policy!r}")
        object.__setattr__(self, "kv_heads", heads)


@dataclass(frozen=True)
class HeadPlan:
    """Per layer, the parts that cover its KV heads: ``layers[l]`` is a tuple of ``Part``.

    ``allocator`` (optional): applied when the prompt is compressed, to every layer made of one part, in place of
    that part's uniform budget (Ada-KV's one top-k over the layer's heads, ``course.headwise.budgets``): the
    layer's heads then each hold their own number of slots."""

    layers: tuple[tuple[Part, ...], ...]
    n_kv_heads: int
    allocator: Allocator | None = None

    def __post_init__(self) -> None:
        if isinstance(self.n_kv_heads, bool) or not isinstance(self.n_kv_heads, int) or self.n_kv_heads < 1:
            raise ValueError(f"n_kv_heads must be an integer >= 1, got {self.n_kv_heads!r}")
        layers = tuple(tuple(parts) for parts in self.layers)
        if not layers:
            raise ValueError("a HeadPlan needs at least one layer")
        for i, parts in enumerate(layers):
            heads = sorted(h for part in parts for h in part.kv_heads)
            if heads != list(range(self.n_kv_heads)):
                missing = sorted(set(range(self.n_kv_heads)) - set(heads))
                extra = sorted({h for h in heads if heads.count(h) > 1 or not 0 <= h < self.n_kv_heads})
                raise ValueError(f"layer {i}: the parts must cover KV heads 0..{self.n_kv_heads - 1} exactly once; "
                                 f"missing {missing}, repeated or out of range {extra}")
        object.__setattr__(self, "layers", layers)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def policies(self) -> list[Policy]:
        """Every part's policy, layer by layer."""
        return [part.policy for parts in self.layers for part in parts]


class HeadwisePolicy(Policy):
    """A ``HeadPlan`` where a policy goes: ``model.new_cache(batch, policy)`` then returns a ``HeadwiseCache``.

    It decides nothing itself (its parts' policies do, each over its own heads); ``check_model`` checks the plan's
    shape against the model and every part's policy against it."""

    name = "headwise"

    def __init__(self, plan: HeadPlan, label: str = "headwise") -> None:
        if not isinstance(plan, HeadPlan):
            raise TypeError(f"plan must be a HeadPlan, got {type(plan).__name__}")
        self.plan = plan
        self._label = label
        self.budget = None
        rules = {p.position_rule for p in plan.policies()}
        self.position_rule = "cache" if "cache" in rules else "original"
        # a part's store (make_policy(..., quantizer=...)): the model then caches keys before rotation, as for KVCache
        self.quantizer = next((p.quantizer for p in plan.policies() if p.quantizer is not None), None)

    @property
    def prompt_budget(self) -> None:
        return None

    def attention_rows(self, n_queries: int) -> int:
        """The most rows of attention weights any part's policy reads (each part takes its own share)."""
        return max(p.attention_rows(n_queries) for p in self.plan.policies())

    def check_model(self, config) -> None:
        """Refuse a plan shaped for another model, and any part's policy the model cannot run."""
        if (self.plan.n_layers, self.plan.n_kv_heads) != (config.n_layer, config.n_kv_head):
            raise ValueError(f"this plan has {self.plan.n_layers} layers x {self.plan.n_kv_heads} KV heads but "
                             f"{config.name} has {config.n_layer} x {config.n_kv_head}: build it from its config")
        for policy in self.plan.policies():
            policy.check_model(config)

    @property
    def label(self) -> str:
        return self._label

