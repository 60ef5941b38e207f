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
never refused by the model's cache.

Layers: policies read one layer's slots (``course.slots.LayerCache``, below them) and import neither the stores
(``course.storage``: how the kept numbers are held) nor the cache that composes the two (``course.kvcache``). Each
policy is one file of this package that registers its own rows; a new one is imported at the end of this file.
"""

from course.policies.base import INF, PROTECTED, Policy, PositionRule, group_mean
from course.policies.registry import PLACES, POLICIES, PolicyKind, make_policy, policy_names, register
from course.policies.sinks import PinSinks, pinned

# The policies, in the order the course shows them (each file registers its own rows of the table).
from course.policies.full import FullCache  # noqa: E402  (after the table: each file adds its rows to it)
from course.policies.window import SlidingWindow  # noqa: E402
from course.policies.streaming import StreamingLLM  # noqa: E402
from course.policies.h2o import H2O, accumulate_attention  # noqa: E402
from course.policies.snapkv import SnapKV  # noqa: E402
from course.policies.random import RandomEviction  # noqa: E402

__all__ = ["Policy", "FullCache", "SlidingWindow", "PinSinks", "StreamingLLM", "H2O", "SnapKV", "RandomEviction",
           "accumulate_attention", "make_policy", "PolicyKind", "POLICIES", "PLACES", "register", "policy_names",
           "pinned", "group_mean", "PROTECTED", "INF", "PositionRule"]
