"""``PolicyCache`` in half precision over a long stream (issue 36): every cached key is the float32 rotation of the
key as it arrived, by its current offset, to within one rounding of the dtype, after 5,000 tokens, for every policy
and position rule ``PolicyCache`` takes on a RoPE model, in bfloat16 and float16.

A key's rotation is always computed afresh from the key as it arrived, never as a rotation of a rotation, so no
rounding adds up with the stream's length (tests/test_policy_cache_in_use.py holds the greedy choices that follow).
"""

from __future__ import annotations

import pytest
import torch

from course.models.llama import rope
from course.policies import make_policy
from course.transformers_cache import PolicyCache, course_config

from .test_policy_cache_in_use import HALF_TOKENS, PAD, THETA, tiny_half
from .test_transformers_cache import BUDGET

pytestmark = pytest.mark.slow  # kernels, notebooks or the real model at length: not in the contributor suite

EVERY_RULE = [  # every policy and position rule PolicyCache takes on a RoPE model
    ("full", {}, "sdpa"),
    ("window", {}, "sdpa"), ("window", {"positions": "cache"}, "sdpa"),
    ("streaming", {}, "sdpa"), ("streaming", {"positions": "original"}, "sdpa"),
    ("h2o", {"sinks": 2}, "eager"), ("h2o", {"sinks": 2, "positions": "cache"}, "eager"),
    ("h2o-mean", {}, "eager"), ("h2o-mean", {"positions": "cache"}, "eager"),
    ("snapkv", {}, "eager"), ("snapkv", {"positions": "cache"}, "eager"),
    ("random", {}, "sdpa"), ("random", {"positions": "cache"}, "sdpa"),
]



def record_arrivals(cache: PolicyCache) -> list[list[torch.Tensor]]:
    """Every key as it reaches each layer of the cache (rotated by transformers at its stream position, in the
    model's dtype), in stream order: per layer, a list of [B, H_kv, T, d] chunks."""
    arrived = [[] for _ in cache.layers]
    for layer in cache.layers:
        update = layer.update

        def recording(key_states, value_states, *args, _update=update, _i=layer.layer_idx, **kwargs):
            arrived[_i].append(key_states.detach().clone())
            return _update(key_states, value_states, *args, **kwargs)

        layer.update = recording
    return arrived


def key_errors(cache: PolicyCache, arrived, rule: str) -> tuple[float, int]:
    """The largest relative distance, over every layer and slot, between the key a layer attended with last and
    the float32 rotation of that key as it arrived by its offset, cast to the dtype: the offset being, under
    positions inside the cache, rank + n - S - position (the query at rank S - 1 and position n - 1). Also the
    largest offset (0 under original positions)."""
    n, worst, largest = cache.seen, 0.0, 0
    for i, layer in enumerate(cache.layers):
        pos = cache.positions(i)  # [B, H_kv, S]
        keys = layer.keys.float()
        everything = torch.cat(arrived[i], dim=2)  # [B, H_kv, n, d]
        orig = everything.gather(2, pos[..., None].expand(-1, -1, -1, keys.shape[-1]))
        offset = torch.zeros_like(pos) if rule == "original" else pos.argsort(-1).argsort(-1) + n - pos.shape[-1] - pos
        exact = rope(orig.float(), offset, THETA).to(layer.keys.dtype).float()
        worst = max(worst, float(((keys - exact).norm(dim=-1) / exact.norm(dim=-1)).max()))
        largest = max(largest, int(offset.max()))
    return worst, largest


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name,kw,impl", EVERY_RULE,
                         ids=[f"{n}-{kw.get('positions', 'default')}" for n, kw, _ in EVERY_RULE])
def test_half_precision_keys_stay_exact_over_a_long_stream(dtype, name, kw, impl):
    hf = tiny_half(dtype, impl)
    policy = make_policy(name, BUDGET, model=course_config(hf), **kw)
    ids = torch.randint(0, PAD, (1, HALF_TOKENS), generator=torch.Generator().manual_seed(4))
    with PolicyCache(hf, policy) as cache, torch.inference_mode():
        arrived = record_arrivals(cache)
        hf(ids[:, :24], cache=cache)  # a prompt longer than the budget (SnapKV compresses it), then token by token
        for t in range(24, HALF_TOKENS):
            hf(ids[:, t : t + 1], cache=cache)
        err, largest = key_errors(cache, arrived, policy.position_rule)
        assert cache.seen == HALF_TOKENS
    print(f"{policy.label} ({policy.position_rule} positions), {dtype}: largest offset {largest}, key error {err:.1e}")
    assert err <= torch.finfo(dtype).eps  # one rounding of the dtype, not an accumulation
    if policy.position_rule == "cache" and name in ("streaming", "h2o", "h2o-mean"):  # (random rarely keeps a key long)
        assert largest > HALF_TOKENS // 2  # keys did move, far: the check above covered re-rotated keys
