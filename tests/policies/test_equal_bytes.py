"""Comparing stores at the same bytes (``course.equal_bytes``) and the error attention sees from a rounded key
(``course.rounding_error``): slot matching, a store's bytes as held after a prompt, Wilson's interval, and the
logit error checked against attention computed directly."""

from __future__ import annotations

import math

import pytest
import torch

from course.equal_bytes import prompt_store_fraction, slots_for
from course.evaluate import NeedleTrial
from course.exercises.fixtures import tiny_model
from course.policies import make_policy
from course.quantize import KIVI, fake_quantize
from course.rope import rope
from course.rounding_error import logit_error_by_token, queries, weight_change_by_token
from course.stats import proportion_interval


def test_slots_for_gives_eviction_at_least_the_bytes_and_never_a_whole_slot_more():
    for fraction in (0.2766, 0.25, 0.3, 1.0):
        s = slots_for(fraction, 383)
        assert s / 383 >= fraction and (s - 1) / 383 < fraction
    with pytest.raises(ValueError, match="fraction must be in"):
        slots_for(0.0, 100)
    with pytest.raises(ValueError, match="tokens must be a positive integer"):
        slots_for(0.5, 0)


def test_wilson_interval_matches_the_textbook_values():
    low, high = proportion_interval(5, 6)  # Wilson, z = 1.96: 0.436 to 0.970
    assert math.isclose(low, 0.4365, abs_tol=1e-3) and math.isclose(high, 0.9699, abs_tol=1e-3)
    assert proportion_interval(0, 6)[0] == 0.0 and proportion_interval(6, 6)[1] == 1.0
    with pytest.raises(ValueError, match="k must be an integer from 0 to n=6"):
        proportion_interval(7, 6)


def _trials(model, n: int, tokens: int) -> list[NeedleTrial]:
    gen = torch.Generator().manual_seed(1)
    return [NeedleTrial(torch.randint(0, model.config.vocab_size, (1, tokens), generator=gen), torch.tensor([1, 2]),
                        (10, 20), 0.3, str(i)) for i in range(n)]


def test_a_quantized_store_after_a_prompt_holds_more_than_its_long_run_cost():
    model = tiny_model("llama")
    c = model.config
    trials = _trials(model, 2, 100)
    store = KIVI(bits=2, group=8, residual=8, exact_sinks=4)
    held = prompt_store_fraction(model, trials, lambda t: make_policy("full", quantizer=store))
    long_run = store.bytes_per_token(c.n_layer, c.n_kv_head, c.head_dim) / c.cache_bytes_per_token(2)
    assert all(long_run < h < 1 for h in held)
    # an eviction policy holds exactly its slots
    evicted = prompt_store_fraction(model, trials, lambda t: make_policy("streaming", 33, model=model))
    assert all(math.isclose(f, 33 / 100) for f in evicted)


def test_the_logit_error_is_the_change_of_the_attention_logits():
    torch.manual_seed(0)
    h, h_kv, t, d, theta = 4, 2, 12, 8, 10000.0
    q, keys = torch.randn(h, t, d), torch.randn(h_kv, t, d)
    got = logit_error_by_token(q, keys, bits=2, group=4, theta=theta)  # [H_kv, T]
    rounded = torch.cat([fake_quantize(keys[:, s : s + 4], 2, dim=1) for s in range(0, t, 4)], dim=1)
    pos = torch.arange(t)[None]
    before = q @ rope(keys[None], pos, theta)[0].repeat_interleave(2, 0).transpose(1, 2) / d**0.5
    after = q @ rope(rounded[None], pos, theta)[0].repeat_interleave(2, 0).transpose(1, 2) / d**0.5
    change = (after - before).abs()  # [H, T queries, T keys]
    for j in (0, 5, 11):
        want = change[:, j:, j].mean(dim=1).view(h_kv, 2).mean(dim=1)  # the queries that see key j
        assert torch.allclose(got[:, j], want, atol=1e-5)
    with pytest.raises(ValueError, match="H a multiple of H_kv"):
        logit_error_by_token(torch.randn(3, t, d), keys, 2, 4, theta)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_queries_are_the_ones_attention_uses(family):
    model = tiny_model(family)
    c = model.config
    ids = torch.randint(0, c.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    qs = queries(model, ids)
    assert len(qs) == c.n_layer and qs[0].shape == (c.n_head, 9, c.head_dim)
    if family == "llama":  # the first layer's queries from its own projection, rotated
        x = model.blocks[0].norm1(model.embed(ids, torch.arange(9)[None], 9))
        q = model.blocks[0].attn.q(x).view(1, 9, c.n_head, c.head_dim).transpose(1, 2)
        assert torch.allclose(qs[0], rope(q, torch.arange(9)[None], c.rope_theta)[0].float(), atol=1e-5)


def test_the_weight_change_is_the_change_of_the_causal_attention_weights():
    torch.manual_seed(1)
    h, h_kv, t, d = 2, 1, 10, 8
    q, keys = torch.randn(h, t, d), torch.randn(h_kv, t, d) * 3
    got = weight_change_by_token(q, keys, bits=2, group=5, theta=None)  # keys as attended
    rounded = torch.cat([fake_quantize(keys[:, s : s + 5], 2, dim=1) for s in range(0, t, 5)], dim=1)
    future = torch.ones(t, t).triu(1).bool()
    w = [torch.softmax((q @ k.expand(h, t, d).transpose(1, 2) / d**0.5).masked_fill(future, -torch.inf), -1)
         for k in (keys, rounded)]
    for j in (0, 4, 9):
        assert torch.allclose(got[0, j], (w[1] - w[0]).abs()[:, j:, j].mean(), atol=1e-6)


def test_the_frontier_plot_draws_the_paired_ratio_and_its_interval():
    import matplotlib

    matplotlib.use("Agg")
    from course.frontier import StorePoint
    from course.plots import frontier_plot

    full = StorePoint("full cache", "full", 1.0, (10.0, 20.0, 40.0))
    store = StorePoint("quantization", "2-bit", 0.3, (11.0, 24.0, 42.0))  # ratios 1.1, 1.2, 1.05
    fig = frontier_plot([full, store], reference=full, title="t")
    ax = fig.axes[0]
    ys = sorted(y for line in ax.lines for y in line.get_ydata() if len(line.get_xdata()) == 1)
    assert 1.1 in [round(y, 6) for y in ys]  # the median of the paired ratios, not of the perplexities
    segments = [s for c in ax.collections for s in c.get_segments()]
    assert any(abs(s[0][1] - 1.05) < 1e-9 and abs(s[1][1] - 1.2) < 1e-9 for s in segments)  # the range (n < 8)
