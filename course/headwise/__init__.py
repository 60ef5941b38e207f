"""Caches whose heads hold different lengths: not every head needs the whole cache.

Most heads behave like StreamingLLM heads (sinks and a recent window); a few retrieval heads need the far past
(Wu et al. 2024, arXiv 2404.15574). A head-wise plan (``HeadPlan``) gives each KV head of each layer its own policy,
grouped in *parts* (``Part``); the cache that follows it (``HeadwiseCache``) holds each part in its own one-layer
``course.kvcache.KVCache``, so the heads really hold different lengths and the bytes are counted honestly; attention
takes one transient padded view per layer, its padding masked per KV head.

A ``HeadwisePolicy`` goes wherever a policy goes: ``model.new_cache(batch, policy)`` returns a ``HeadwiseCache``,
and ``compress_prompts``, ``compare_after_compression`` and the needle evaluators take it as they are.

Builders: ``uniform`` (every head alike: exactly ``KVCache``), ``duo_attention`` and ``duo_at_bytes``
(DuoAttention, arXiv 2410.10819), ``pyramid_kv`` with ``pyramid_budgets`` (PyramidKV, arXiv 2406.02069), ``ada_kv``
with ``adakv_counts`` (Ada-KV, arXiv 2407.11550).

Modules: ``plan`` (``Part``, ``HeadPlan``, ``HeadwisePolicy``), ``cache`` (``HeadwiseCache``), ``padding`` (the padded
view and the split of the weights), ``builders`` (uniform, DuoAttention), ``budgets`` (PyramidKV, Ada-KV).
"""

from course.headwise.budgets import ada_kv, adakv_counts, adakv_keep, pyramid_budgets, pyramid_kv
from course.headwise.builders import duo_at_bytes, duo_attention, uniform
from course.headwise.cache import HeadwiseCache, PaddedLayer
from course.headwise.plan import HeadPlan, HeadwisePolicy, Part

__all__ = ["Part", "HeadPlan", "HeadwisePolicy", "HeadwiseCache", "PaddedLayer", "uniform", "duo_attention",
           "duo_at_bytes", "pyramid_kv", "pyramid_budgets", "ada_kv", "adakv_counts", "adakv_keep"]
