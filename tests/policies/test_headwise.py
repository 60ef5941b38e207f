"""The head-wise cache (``course.headwise``): heads that hold different lengths attend exactly as a full cache whose
slots are hidden per head (float64, GPT-2's multi-head and Llama's grouped-query attention, prompt then decode, both
of Llama's paths), the uniform plan is ``KVCache`` to the bit, and the bytes are the heads' own slots."""

from __future__ import annotations

import pytest
import torch

from course.headwise import HeadPlan, HeadwiseCache, HeadwisePolicy, Part, ada_kv, duo_attention, uniform
from course.kvcache import AttentionView
from course.policies import FullCache, StreamingLLM, make_policy

from ..conftest import tiny_model

PROMPT, DECODE, SINKS = 30, 12, 2


class MaskedFullCache:
    """The reference: a full cache (every token kept) whose views hide, per KV head, what ``keep`` rejects.

    keep(layer, k_pos [B, H_kv, S], q_pos [B, T]) -> [B, H_kv, T, S] bool. Independent of the head-wise cache: no
    parts, no padding, no eviction; the model attends over every token with a mask."""

    def __init__(self, model, keep, rotated: bool) -> None:
        self.inner = model.new_cache(1, None, rotated=rotated)
        self.keep = keep

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def update(self, layer_idx, k, v, pos, mask=True):
        view = self.inner.update(layer_idx, k, v, pos)
        causal = view.positions[:, :, None, :] <= pos[:, None, :, None]
        hidden = causal & self.keep(layer_idx, view.positions, pos)
        return AttentionView(view.keys, view.values, view.positions, hidden, view.weight_rows, view.n_queries,
                             view.rope_positions)


def duo_keep(retrieval, windows):
    """DuoAttention's rule by positions: the prompt (queries before PROMPT) attends fully; then a retrieval head
    sees everything, a streaming head its SINKS first tokens and the ``window`` most recent."""

    def keep(layer, k_pos, q_pos):
        q = q_pos[:, None, :, None]
        k = k_pos[:, :, None, :]
        w = windows[layer][None, :, None, None]
        full = retrieval[layer][None, :, None, None]
        return (q < PROMPT) | full | (k < SINKS) | (k > q - w)

    return keep


@torch.no_grad()
def run(model, cache, ids, compress: bool = True) -> list[torch.Tensor]:
    """Logits of the prompt (ids[:, :PROMPT]) and of every decoded token after it, one at a time."""
    out = [model(ids[:, :PROMPT], cache=cache).logits]
    if compress:
        cache.compress()
    for i in range(PROMPT, ids.shape[1]):
        out.append(model(ids[:, i : i + 1], cache=cache).logits)
    return out


def patterns(config):
    """A retrieval pattern and ragged windows: every layer mixes kinds, and windows differ within a layer."""
    retrieval = torch.zeros(config.n_layer, config.n_kv_head, dtype=torch.bool)
    retrieval[0, 0] = retrieval[1, -1] = True
    windows = 3 + torch.arange(config.n_layer * config.n_kv_head).view(config.n_layer, config.n_kv_head) % 4
    return retrieval, windows


@pytest.mark.parametrize("rotated", [True, False])
def test_ragged_heads_attend_as_a_masked_full_cache(family, rotated):
    model = tiny_model(family)
    ids = torch.randint(0, 97, (1, PROMPT + DECODE), generator=torch.Generator().manual_seed(1))
    retrieval, windows = patterns(model.config)
    cache = model.new_cache(1, duo_attention(model.config, retrieval, SINKS, windows), rotated=rotated)
    assert isinstance(cache, HeadwiseCache) and len(cache.parts[0]) > 1  # the padded path, not one part
    got = run(model, cache, ids)
    want = run(model, MaskedFullCache(model, duo_keep(retrieval, windows), rotated), ids, compress=False)
    for step, (g, w) in enumerate(zip(got, want)):
        assert torch.allclose(g, w, atol=1e-10, rtol=0), f"step {step}: {(g - w).abs().max():.2e}"
    # and the hidden slots matter: the same model with every head full answers otherwise after the prompt
    full = run(model, model.new_cache(1, None), ids)
    assert (full[-1] - got[-1]).abs().max() > 1e-3


def test_grouped_query_heads_share_their_kv_heads_slots():
    """GQA: the two query heads of a KV head both read exactly that head's slots (weights over padding are 0)."""
    model = tiny_model("llama")
    retrieval, windows = patterns(model.config)
    cache = model.new_cache(1, duo_attention(model.config, retrieval, SINKS, windows))
    ids = torch.randint(0, 97, (1, PROMPT + 3), generator=torch.Generator().manual_seed(2))
    run(model, cache, ids[:, :PROMPT + 2])
    with torch.no_grad():
        out = model(ids[:, -1:], cache=cache, output_attentions=True)
    slots = cache.slots_per_head()
    g = model.config.n_head // model.config.n_kv_head
    for layer, (w, k_pos) in enumerate(zip(out.attentions, out.key_positions)):
        for q in range(model.config.n_head):
            n = int(slots[layer, q // g])
            assert bool((k_pos[0, q // g, :n] >= 0).all()) and bool((k_pos[0, q // g, n:] < 0).all())
            assert float(w[0, q, -1, n:].abs().sum()) == 0.0
            assert abs(float(w[0, q, -1, :n].sum()) - 1.0) < 1e-12


@pytest.mark.parametrize("name,kw", [("streaming", {}), ("h2o", {"sinks": 2}), ("snapkv", {}), ("window", {}),
                                     ("streaming", {"positions": "original"})])
def test_the_uniform_plan_is_kvcache_exactly(family, name, kw):
    model = tiny_model(family)
    ids = torch.randint(0, 97, (1, PROMPT + DECODE), generator=torch.Generator().manual_seed(3))
    policy = make_policy(name, 12, model=model.config, **kw)
    got = run(model, model.new_cache(1, uniform(model.config, policy)), ids)
    want = run(model, model.new_cache(1, make_policy(name, 12, model=model.config, **kw)), ids)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_parts_under_the_cache_rule_keep_their_own_distances():
    """StreamingLLM's positions inside the cache, per part: one policy split over two parts (the padded path, each
    part's keys shifted to the queries' original positions on the readable path) attends as the one part."""
    model = tiny_model("llama")
    ids = torch.randint(0, 97, (1, PROMPT + DECODE), generator=torch.Generator().manual_seed(4))
    for rotated in (True, False):
        split = HeadPlan(tuple((Part((0,), StreamingLLM(SINKS, 6)), Part((1,), StreamingLLM(SINKS, 6)))
                               for _ in range(model.config.n_layer)), model.config.n_kv_head)
        got = run(model, model.new_cache(1, HeadwisePolicy(split), rotated=rotated), ids)
        want = run(model, model.new_cache(1, StreamingLLM(SINKS, 6), rotated=rotated), ids)
        for g, w in zip(got, want):
            assert torch.allclose(g, w, atol=1e-10, rtol=0)


def test_bytes_are_the_heads_own_slots(family):
    model = tiny_model(family)
    c = model.config
    retrieval, windows = patterns(c)
    cache = model.new_cache(1, duo_attention(c, retrieval, SINKS, windows))
    ids = torch.randint(0, 97, (1, PROMPT), generator=torch.Generator().manual_seed(5))
    model(ids, cache=cache)
    cache.compress()
    slots = cache.slots_per_head()
    assert torch.equal(slots, torch.where(retrieval, PROMPT, SINKS + windows))
    assert cache.bytes_at(2) == 2 * int(slots.sum()) * c.head_dim * 2
    full = model.new_cache(1, None)
    model(ids, cache=full)
    assert cache.bytes_at(2) < full.bytes_at(2)
    assert cache.n_slots == PROMPT
    for layer in range(c.n_layer):
        kept = cache.kept_positions(layer)
        for h in range(c.n_kv_head):
            want = torch.arange(PROMPT) if retrieval[layer, h] else torch.cat(
                [torch.arange(SINKS), torch.arange(PROMPT - int(windows[layer, h]), PROMPT)])
            assert torch.equal(kept[h], want)


def test_ada_kv_heads_attend_as_a_masked_full_cache(family):
    """Ada-KV's ragged heads (one part per head after the prompt) against the full cache hiding what they dropped."""
    model = tiny_model(family)
    ids = torch.randint(0, 97, (1, PROMPT + DECODE), generator=torch.Generator().manual_seed(6))
    cache = model.new_cache(1, ada_kv(model.config, 8, obs_window=4))
    got = run(model, cache, ids)
    slots = cache.slots_per_head()
    assert slots.sum(1).tolist() == [model.config.n_kv_head * (8 + DECODE)] * model.config.n_layer
    assert len(set(slots.flatten().tolist())) > 1  # really ragged
    kept = [cache.kept_positions(layer) for layer in range(model.config.n_layer)]

    def keep(layer, k_pos, q_pos):
        held = torch.zeros_like(k_pos, dtype=torch.bool)
        for h, positions in enumerate(kept[layer]):
            held[:, h] = torch.isin(k_pos[:, h], positions)
        return (q_pos[:, None, :, None] < PROMPT) | held[:, :, None, :]

    want = run(model, MaskedFullCache(model, keep, True), ids, compress=False)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-10, rtol=0)


def test_refusals():
    model = tiny_model("llama")
    c = model.config
    with pytest.raises(ValueError, match="chunks"):
        model.new_cache(1, uniform(c, FullCache()), chunks="stream")
    with pytest.raises(ValueError, match=r"layer 0: .*missing \[1\]"):
        HeadPlan(((Part((0,), FullCache()),),), 2)
    with pytest.raises(ValueError, match="repeats"):
        Part((0, 0), FullCache())
    with pytest.raises(ValueError, match="layers x"):
        model.new_cache(1, uniform(tiny_model("llama", n_layer=3).config, FullCache()))
    with pytest.raises(ValueError, match="re-assigns positions"):
        tiny_model("gpt2").new_cache(1, uniform(tiny_model("gpt2").config, StreamingLLM(2, 6)))
    with pytest.raises(ValueError, match="batch=1"):
        cache = model.new_cache(2, ada_kv(c, 8, obs_window=4))
        model(torch.randint(0, 97, (2, PROMPT)), cache=cache)
        cache.compress()
