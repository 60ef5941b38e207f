"""The KV cache: what a decoder keeps so that it never recomputes the past.

Three layers, one direction. At the bottom, one layer's slots (``course.slots.LayerCache``): keys, values and each
slot's original position, preallocated, growing by doubling. Above it, side by side, *what is kept* (the policies,
``course.policies``: which slots survive) and *how it is stored* (the stores, ``course.storage``: full precision,
KIVI, ...). On top, this package: ``KVCache`` composes one policy and one store over every layer of a model.

When a budgeted policy is full, the new token is written *into the slot of the evicted one* (per batch row and KV
head: H2O and SnapKV keep different tokens in different heads).

Keys are stored before any rotary embedding, so the model can give cached keys new positions (StreamingLLM's
position re-assignment, see ``rope_positions``): the readable path, where the model rotates every cached key at every
step. A cache made with ``rope_theta`` takes keys already rotated at their original positions instead (as
transformers caches them, and the course's Llama on its fast path) and keeps each one rotated where the policy puts
it: only the keys the policy moves are rotated again, always from the key as it arrived, in float32
(``course.kvcache.rotation``).

The cache is the only partner of attention. A layer hands it the new tokens' keys and values (``update``) and gets
back an ``AttentionView``: everything it attends with (keys, values, the positions RoPE should use, the mask, how
many rows of weights the policy wants); it hands the weights back with ``observe``. Policies never see the model,
and the model never sees the policy.

Modules: ``cache`` (``KVCache``: update, observe, eviction, compression), ``positions`` (the position rules),
``rotation`` (rotated keys), ``stored`` (the store's calls), ``inspection`` (sizes, fill, rewind), ``view``
(``AttentionView``), ``group`` (``CacheGroup``: one prompt forward for several caches), ``stack`` (``CacheStack``:
several caches decoding side by side), ``sizes`` (bytes from a model's shapes).
"""

from course.kvcache.cache import KVCache
from course.kvcache.group import CacheGroup
from course.kvcache.stack import CacheStack
from course.kvcache.sizes import cache_bytes_per_token, longest_prompt, prefill_bytes_per_token
from course.kvcache.view import AttentionView, Chunks, SinkRotation
from course.slots import LayerCache

__all__ = ["LayerCache", "KVCache", "CacheGroup", "CacheStack", "AttentionView", "SinkRotation",
           "cache_bytes_per_token", "Chunks", "prefill_bytes_per_token", "longest_prompt"]
