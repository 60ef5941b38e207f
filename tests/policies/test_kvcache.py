"""The KV cache: it applies a policy (never above the budget, sinks never dropped), counts its bytes, refuses
what the model cannot do, and without a policy never evicts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.kvcache import KVCache, cache_bytes_per_token
from course.policies import H2O, FullCache, PinSinks, RandomEviction, SlidingWindow, StreamingLLM, make_policy

from tests.conftest import tiny_model


def policies(budget: int, n_sink: int):
    """Every policy at a total budget, with and without pinned sinks."""
    base = [SlidingWindow(budget), H2O(budget - budget // 2, budget // 2), RandomEviction(budget, seed=1)]
    out = base + [StreamingLLM(n_sink, budget - n_sink)] if n_sink < budget else list(base)
    if 0 < n_sink < budget:
        out += [PinSinks(p, n_sink) for p in base]
    return out


@settings(max_examples=25, deadline=None)
@given(budget=st.integers(3, 12), n_sink=st.integers(0, 4), length=st.integers(1, 30), batch=st.integers(1, 2),
       family=st.sampled_from(["gpt2", "llama"]))
def test_budget_never_exceeded_and_sinks_never_dropped(budget, n_sink, length, batch, family):
    model = tiny_model(family)
    ids = torch.randint(0, 97, (batch, length))
    for policy in policies(budget, n_sink):
        if policy.position_rule == "cache" and family == "gpt2":
            continue
        cache = model.new_cache(batch, policy)
        pinned = getattr(policy, "n_sink", 0)
        with torch.no_grad():
            for t in range(length):
                model(ids[:, t : t + 1], cache=cache)
                for layer in cache.layers:
                    pos = layer.live()[2]
                    assert layer.length <= budget, policy
                    assert layer.length == min(t + 1, budget)
                    for p in range(min(pinned, t + 1)):  # every sink is in every (batch, head)
                        assert bool((pos == p).any(-1).all()), (policy, t, p)
                    assert bool((pos == t).any(-1).all())  # the newest token is always there
                    srt = pos.sort(-1).values
                    assert bool((srt[..., 1:] > srt[..., :-1]).all())  # no token twice


def test_cache_bytes_formula():
    model = tiny_model("llama", dtype=torch.float32)
    cache = model.new_cache(2)
    with torch.no_grad():
        model(torch.randint(0, 97, (2, 9)), cache=cache)
    c = model.config
    assert cache.nbytes == 2 * cache_bytes_per_token(c.n_layer, c.n_kv_head, c.head_dim, 4) * 9
    assert cache.nbytes == 2 * c.n_layer * 2 * c.n_kv_head * c.head_dim * 9 * 4
    assert cache.allocated_bytes >= cache.nbytes


def test_gpt2_refuses_position_reassignment():
    model = tiny_model("gpt2")
    with pytest.raises(ValueError, match=r"\(GPT-2 family\) cannot do"):
        model.new_cache(1, StreamingLLM(4, 10))
    model.new_cache(1, StreamingLLM(4, 10, positions="original"))  # fine
    with pytest.raises(ValueError, match=r"positions='cache'.*\(GPT-2 family\) cannot do"):
        make_policy("h2o", 16, positions="cache", model=model)


def test_full_cache_never_evicts():
    cache = KVCache(1, 1, 1, 2, policy=FullCache())
    layer = cache.layers[0]
    for t in range(100):
        cache.update(0, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2), torch.tensor([[t]]))
    assert layer.length == 100 and layer.capacity >= 100
