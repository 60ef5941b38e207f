"""The exact fast evaluator against the decode loop, and StreamingLLM's position rule."""

from __future__ import annotations

import pytest
import torch

from course.policies import H2O, FullCache, PinSinks, SlidingWindow, StreamingLLM
from course.streaming import decode_stream, evaluate_stream, exact_stream, recompute_stream

from tests.conftest import tiny_model

STATIC = [
    FullCache(), SlidingWindow(7), StreamingLLM(2, 6, positions="original"), StreamingLLM(4, 5, positions="original"),
    StreamingLLM(1, 9), StreamingLLM(3, 4), StreamingLLM(0, 8),
    PinSinks(SlidingWindow(8), 2, start=5), PinSinks(SlidingWindow(6), 3, start=11),  # pinned in the middle
]


CASES = [(f, p) for f in ("gpt2", "llama") for p in STATIC if not (f == "gpt2" and p.position_rule == "cache")]


@pytest.mark.parametrize(("family", "policy"), CASES, ids=lambda x: x if isinstance(x, str) else
                         f"{x.label}-{x.position_rule}")
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_exact_evaluator_equals_decode_loop(family, policy, chunk):
    model = tiny_model(family)
    ids = torch.randint(0, 97, (2, 40))
    a = decode_stream(model, ids, policy, progress=False)
    b = exact_stream(model, ids, policy, chunk=chunk, progress=False)
    assert (a.nll - b.nll).abs().max() <= 1e-8
    assert a.cache_bytes == b.cache_bytes and a.fill == b.fill


@pytest.mark.slow
def test_exact_evaluator_equals_decode_loop_on_smollm2(smollm2_f64, austen_ids):
    model = smollm2_f64[0]  # float64: a question of sameness, which float32 round-off must not decide
    ids = austen_ids[:, :160]
    for policy in (StreamingLLM(4, 60), SlidingWindow(64)):
        a = decode_stream(model, ids, policy, progress=False)
        b = exact_stream(model, ids, policy, chunk=48, progress=False)
        diff = (a.nll - b.nll).abs().max().item()
        print(f"{policy.label}: max |NLL diff| in float64 = {diff:.2e}, speed-up {a.seconds / b.seconds:.1f}x")
        assert diff <= 1e-8


def test_position_reassignment_equals_fresh_forward_over_kept_tokens():
    # With one layer, a cached K/V depends on its token only, so a StreamingLLM cache with
    # re-assigned positions must give exactly the logits of a fresh forward over the kept
    # tokens at positions 0..n-1.
    model = tiny_model("llama", n_layer=1)
    policy = StreamingLLM(2, 5)
    ids = torch.randint(0, 97, (1, 25))
    cache = model.new_cache(1, policy)
    with torch.no_grad():
        for t in range(25):
            logits = model(ids[:, t : t + 1], cache=cache).logits[:, -1]
            kept = sorted(cache.positions(0)[0, 0].tolist())
            fresh = model(ids[:, kept]).logits[:, -1]  # positions 0..len(kept)-1
            assert torch.allclose(logits, fresh, atol=1e-10), t
    assert kept == [0, 1, 20, 21, 22, 23, 24]


def test_original_positions_differ_from_reassigned_after_fill():
    model = tiny_model("llama")
    ids = torch.randint(0, 97, (1, 30))
    a = exact_stream(model, ids, StreamingLLM(2, 6, positions="original"), progress=False)
    b = exact_stream(model, ids, StreamingLLM(2, 6, positions="cache"), progress=False)
    assert torch.allclose(a.nll[:, :8], b.nll[:, :8])  # identical until the cache fills
    assert not torch.allclose(a.nll[:, 8:], b.nll[:, 8:])


def test_exact_evaluator_refuses_dynamic_policies():
    with pytest.raises(ValueError, match="positions alone"):
        exact_stream(tiny_model("llama"), torch.randint(0, 97, (1, 10)), H2O(2, 2))
    r = evaluate_stream(tiny_model("llama"), torch.randint(0, 97, (1, 10)), H2O(2, 2), progress=False)
    assert r.tokens == 10


def test_recompute_baseline_matches_fresh_windows(family):
    model = tiny_model(family)
    ids = torch.randint(0, 97, (1, 20))
    r = recompute_stream(model, ids, window=6, batch=4, progress=False)
    with torch.no_grad():
        for t in (2, 5, 6, 13, 18):
            window = ids[:, max(0, t - 5) : t + 1]
            lp = torch.log_softmax(model(window).logits[0, -1].float(), -1)
            assert abs(-lp[ids[0, t + 1]].item() - r.nll[0, t].item()) < 1e-6


def test_stream_result_numbers():
    model = tiny_model("llama")
    r = exact_stream(model, torch.randint(0, 97, (1, 30)), SlidingWindow(10), progress=False)
    assert r.fill == 10 and r.tokens == 30
    assert r.ppl_after_fill == pytest.approx(r.ppl(10))
    assert r.cache_bytes[-1] == r.cache_bytes[9] == r.max_cache_bytes  # flat once full
    assert exact_stream(model, torch.randint(0, 97, (1, 8)), SlidingWindow(10), progress=False).ppl_after_fill is None
    with pytest.raises(ValueError, match="at least 2 tokens"):
        exact_stream(model, torch.randint(0, 97, (1, 1)))


def test_recompute_at_chosen_positions_matches_fresh_windows_for_every_row(family):
    from course.streaming import recompute_nll

    model = tiny_model(family)
    ids = torch.randint(0, 97, (3, 24), generator=torch.Generator().manual_seed(2))
    targets = [5, 9, 13, 22]
    nll = recompute_nll(model, ids, window=6, targets=targets, batch=5, progress=False)
    assert nll.shape == (3, 4)
    with torch.no_grad():
        for b in range(3):
            for i, t in enumerate(targets):
                lp = torch.log_softmax(model(ids[b : b + 1, t - 5 : t + 1]).logits[0, -1].float(), -1)
                assert abs(-lp[ids[b, t + 1]].item() - nll[b, i].item()) < 1e-6
    with pytest.raises(ValueError, match="targets must be positions between window - 1 = 5 and 22"):
        recompute_nll(model, ids, window=6, targets=[4], progress=False)
    with pytest.raises(ValueError, match="targets must be"):
        recompute_nll(model, ids, window=6, targets=[23], progress=False)


def test_per_stream_perplexity_is_each_rows_own():
    model = tiny_model("llama")
    ids = torch.randint(0, 97, (3, 30))
    r = exact_stream(model, ids, SlidingWindow(10), progress=False)
    each = r.ppl_per_stream(10)
    assert len(each) == 3
    for b in range(3):
        alone = exact_stream(model, ids[b : b + 1], SlidingWindow(10), progress=False)
        assert each[b] == pytest.approx(alone.ppl(10), rel=1e-9)
    with pytest.raises(ValueError, match="no scored tokens"):
        r.ppl_per_stream(40)
