"""Eviction policies: what each keeps, make_policy, H2O and SnapKV against direct computations (the cache that
applies them: test_kvcache.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course.kvcache import KVCache, LayerCache
from course.policies import (
    H2O,
    PinSinks,
    SlidingWindow,
    SnapKV,
    StreamingLLM,
    group_mean,
    make_policy,
    policy_names,
)

from tests.conftest import tiny_model


def test_window_keeps_exactly_the_most_recent():
    model = tiny_model("llama")
    cache = model.new_cache(1, SlidingWindow(5))
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 1)), cache=cache)
        for _ in range(11):
            model(torch.randint(0, 97, (1, 1)), cache=cache)
    assert sorted(cache.positions(0)[0, 0].tolist()) == [7, 8, 9, 10, 11]


def test_streaming_llm_keeps_sinks_and_recent():
    model = tiny_model("llama")
    cache = model.new_cache(1, StreamingLLM(2, 3))
    with torch.no_grad():
        for _ in range(12):
            model(torch.randint(0, 97, (1, 1)), cache=cache)
    assert sorted(cache.positions(1)[0, 1].tolist()) == [0, 1, 9, 10, 11]


@pytest.mark.parametrize("name", policy_names())
@pytest.mark.parametrize("sinks", [None, 0, 2])
@pytest.mark.parametrize("positions", [None, "original", "cache"])
def test_make_policy_with_a_model_never_yields_a_policy_its_cache_refuses(family, name, sinks, positions):
    model = tiny_model(family)
    try:
        policy = make_policy(name, 12, sinks=sinks, positions=positions, model=model)
    except ValueError as e:  # refused up front, with the reason: only the impossible request
        assert family == "gpt2" and positions == "cache" and "cannot do" in str(e)
        return
    cache = model.new_cache(2, policy)  # never refused by the cache
    with torch.no_grad():
        model(torch.randint(0, 97, (2, 20)), cache=cache)
        cache.compress()
        for _ in range(4):
            model(torch.randint(0, 97, (2, 1)), cache=cache)
    if positions is None and name == "streaming":
        assert policy.position_rule == ("cache" if family == "llama" else "original")
    if policy.budget is not None:
        assert cache.n_slots <= policy.budget


def test_make_policy_splits_and_defaults_in_one_place():
    assert make_policy("h2o", 11).label == "h2o(6+5)"  # heavy = budget - budget // 2, recent = budget // 2
    assert make_policy("h2o-mean", 11, recent=3).label == "h2o-mean(8+3)"
    assert not make_policy("h2o", 11).normalize and make_policy("h2o-mean", 11).normalize  # the paper's raw sums
    assert make_policy("streaming", 64).label == "streaming(4+60)"
    assert make_policy("streaming", 64, sinks=0).label == "streaming(0+64)"
    assert make_policy("window", 64, sinks=2).label == "window(64)+2 sinks"
    assert make_policy("snapkv", 6).obs_window == 5


def test_policies_do_not_import_the_cache_at_run_time():
    import subprocess
    import sys

    code = "import sys, course.policies; print('course.kvcache' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("bad", [
    lambda: SlidingWindow(0), lambda: StreamingLLM(4, 0), lambda: StreamingLLM(-1, 5), lambda: H2O(-1, 4),
    lambda: SnapKV(8, obs_window=8), lambda: SnapKV(16, kernel=4), lambda: SnapKV(16, pooling="median"),
    lambda: PinSinks(SlidingWindow(4), 4), lambda: SlidingWindow(8, positions="absolute"),
    lambda: make_policy("lru", 10), lambda: make_policy("window"), lambda: make_policy("streaming", 4),
    lambda: make_policy("h2o", 8, recent=9), lambda: make_policy("h2o-mean", 8, recent=9), lambda: make_policy("window", 8, positions="absolute"),
])
def test_bad_policy_parameters_are_refused(bad):
    with pytest.raises(ValueError, match="must|one of|needs|exceed"):
        bad()


# ----------------------------------------------------------------------------- H2O
def test_gqa_group_mean_hand_computed():
    # 4 query heads, 2 KV heads: heads 0,1 -> KV 0; heads 2,3 -> KV 1
    w = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.2, 0.8], [0.6, 0.4]]])  # [B=1, H=4, S=2]
    assert torch.allclose(group_mean(w, 2), torch.tensor([[[0.5, 0.5], [0.4, 0.6]]]))


def test_h2o_accumulates_attention_per_kv_head_raw_and_mean():
    layer = LayerCache(torch.zeros(1, 2, 4, 3), torch.zeros(1, 2, 4, 3), torch.full((1, 2, 4), -1))
    layer.append(torch.zeros(1, 2, 3, 3), torch.zeros(1, 2, 3, 3), torch.tensor([[0, 1, 2]]))
    policy = H2O(heavy=2, recent=0)
    # prompt of 3 queries, 4 query heads (GQA groups of 2)
    w = torch.zeros(1, 4, 3, 3)
    w[:, :, 0, 0] = 1.0
    w[:, :, 1, :2] = torch.tensor([0.5, 0.5])
    w[:, 0, 2] = torch.tensor([0.7, 0.1, 0.2])
    w[:, 1, 2] = torch.tensor([0.3, 0.3, 0.4])
    w[:, 2:, 2] = torch.tensor([0.0, 0.0, 1.0])
    policy.observe(layer, w, seen=0)
    acc = layer.stat("attention")
    assert torch.allclose(acc[0, 0], torch.tensor([1 + 0.5 + 0.5, 0.5 + 0.2, 0.3]))
    assert torch.allclose(acc[0, 1], torch.tensor([1.5, 0.5, 1.0]))
    # H2O (the paper's rule): the raw sums
    assert torch.allclose(policy.scores(layer, seen=3)[0, 0], torch.tensor([2.0, 0.7, 0.3]))
    # h2o-mean: normalised by how many queries could see each key (3, 2, 1 after 3 tokens)
    mean = H2O(heavy=2, recent=0, normalize=True)
    assert torch.allclose(mean.scores(layer, seen=3)[0, 0], torch.tensor([2.0 / 3, 0.7 / 2, 0.3]))


def test_raw_and_mean_h2o_evict_different_tokens():
    """Key 0 was seen by 8 queries, each giving it 0.1 (sum 0.8); key 6 by 2 queries giving 0.3 each
    (sum 0.6). Raw sums keep the old key and evict key 6; the mean rule (0.1 vs 0.3) does the opposite."""
    layer = LayerCache(torch.zeros(1, 1, 8, 2), torch.zeros(1, 1, 8, 2), torch.full((1, 1, 8), -1))
    layer.append(torch.zeros(1, 1, 8, 2), torch.zeros(1, 1, 8, 2), torch.arange(8)[None])
    acc = layer.stat("attention")
    acc[0, 0] = torch.tensor([0.8, 0.9, 0.9, 0.9, 0.9, 0.9, 0.6, 0.5])
    raw, mean = make_policy("h2o", 7, recent=1), make_policy("h2o-mean", 7, recent=1)
    victim = {p.label: int(p.scores(layer, seen=8)[0, 0].argmin()) for p in (raw, mean)}
    assert victim == {"h2o(6+1)": 6, "h2o-mean(6+1)": 0}
    assert int(raw.scores(layer, seen=8)[0, 0].argmax()) == 7 == int(mean.scores(layer, seen=8)[0, 0].argmax())  # recent


def test_h2o_with_budget_at_least_length_equals_dense():
    model = tiny_model("llama")
    ids = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        dense = model(ids).logits
        cache = model.new_cache(2, H2O(heavy=10, recent=10))
        steps = [model(ids[:, t : t + 1], cache=cache).logits for t in range(20)]
    assert torch.allclose(torch.cat(steps, 1), dense, atol=1e-10)


def test_h2o_batch_rows_evict_independently():
    model = tiny_model("llama", seed=3)
    ids = torch.randint(0, 97, (2, 30))
    cache = model.new_cache(2, H2O(heavy=4, recent=2))
    with torch.no_grad():
        for t in range(30):
            model(ids[:, t : t + 1], cache=cache)
    pos = cache.positions(1)
    assert pos.shape == (2, 2, 6)
    assert not torch.equal(pos[0].sort(-1).values, pos[1].sort(-1).values)


# ----------------------------------------------------------------------------- SnapKV
def direct_snapkv(weights, capacity, window, kernel, kv_heads, pooling="avg"):
    """SnapKV's selection written out plainly, one (batch, KV head) at a time.

    Returns the kept positions and the pooled score of every prefix position."""
    b, h, w, s = weights.shape
    group = h // kv_heads
    keep, scores = [], []
    for bi in range(b):
        rows, srows = [], []
        for g in range(kv_heads):
            votes = weights[bi, g * group : (g + 1) * group, :, : s - w].sum(1)  # [group, prefix]
            pool = F.avg_pool1d if pooling == "avg" else F.max_pool1d
            extra = {"count_include_pad": False} if pooling == "avg" else {}
            pooled = pool(votes[:, None], kernel, 1, kernel // 2, **extra)[:, 0].mean(0)
            top = pooled.topk(capacity - w).indices
            rows.append(sorted(top.tolist() + list(range(s - w, s))))
            srows.append(pooled)
        keep.append(rows)
        scores.append(srows)
    return keep, scores


@pytest.mark.parametrize("pooling", ["avg", "max"])
def test_snapkv_selection_matches_direct_computation(pooling):
    torch.manual_seed(0)
    b, h, kv, s, w, cap, kernel = 2, 6, 3, 40, 4, 12, 5
    cache = KVCache(1, b, kv, 8, policy=SnapKV(cap, w, kernel, pooling))
    layer = cache.layers[0]
    layer.append(torch.randn(b, kv, s, 8), torch.randn(b, kv, s, 8), torch.arange(s).expand(b, s))
    weights = torch.softmax(torch.randn(b, h, w, s) * 3, -1)
    cache.policy.observe(layer, weights, seen=0)
    cache.seen = s
    cache.compress()
    got = cache.positions(0).tolist()
    expected, pooled = direct_snapkv(weights, cap, w, kernel, kv, pooling)
    if pooling == "avg":
        assert got == expected
    else:  # max pooling makes ties between neighbours: compare the kept scores, not the tie-break
        for bi in range(b):
            for g in range(kv):
                kept = sorted(pooled[bi][g][[p for p in got[bi][g] if p < s - w]].tolist())
                best = sorted(pooled[bi][g].topk(cap - w).values.tolist())
                assert kept == pytest.approx(best) and got[bi][g][-w:] == list(range(s - w, s))


def test_snapkv_in_the_model_compresses_the_prompt_and_then_grows():
    model = tiny_model("llama")
    cache = model.new_cache(1, SnapKV(capacity=10, obs_window=3))
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 30)), cache=cache)
        cache.compress()
        assert cache.n_slots == 10
        assert all(set(range(27, 30)) <= set(p.tolist()) for p in cache.positions(1)[0])
        for _ in range(4):
            model(torch.randint(0, 97, (1, 1)), cache=cache)
    assert cache.n_slots == 14  # no eviction while decoding


def test_snapkv_with_a_one_query_window_still_votes():
    """The rows handed back are the rows the policy asked for when the layer updated (here: 1 of 12)."""
    model = tiny_model("llama")
    cache = model.new_cache(1, SnapKV(6, obs_window=1, kernel=1))
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 12)), cache=cache)
    votes = cache.layers[0].stat("snapkv")
    assert votes[..., :11].abs().sum() > 0, "the observation window voted"
    cache.compress()
    assert cache.n_slots == 6
