"""Retrieval heads: the score on attention maps built by hand, masking heads before W_O, the random control."""

from __future__ import annotations

import pytest
import torch

from course.evaluate import NeedleTrial, make_needle_trials, needle_eval
from course.heads import (copy_hits, gated_attention, gated_heads, head_sink_mass, kv_head_scores, masked_heads,
                          needle_accuracy_masked, optimize_gates, random_heads, retrieval_scores, streaming_mask,
                          top_heads, top_share)
from course.policies import FullCache

from tests.conftest import tiny_model


def _wo_inputs(model, ids: torch.Tensor, cache=None) -> list[torch.Tensor]:
    """What every layer's W_O receives, [B, T, H·d] per layer."""
    seen: list[torch.Tensor] = []
    outs = [getattr(b.attn, "o", None) or b.attn.out for b in model.blocks]
    hooks = [o.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone())) for o in outs]
    try:
        with torch.no_grad():
            model(ids, cache=cache)
    finally:
        for h in hooks:
            h.remove()
    return seen


@pytest.mark.parametrize("gate", ["none", "elementwise"])
def test_masking_a_head_zeroes_exactly_its_share_of_w_o(family, gate):
    model = tiny_model(family, output_gate=gate)
    c = model.config
    ids = torch.randint(0, c.vocab_size, (2, 12))
    heads = torch.zeros(c.n_layer, c.n_head, dtype=torch.bool)
    heads[0, 1] = True  # Llama: head 0 shares its KV head with head 1 and must not move
    plain = _wo_inputs(model, ids)
    with torch.no_grad():
        before = model(ids).logits
    with masked_heads(model, heads):
        masked = _wo_inputs(model, ids)
        cached = _wo_inputs(model, ids, cache=model.new_cache(2))  # the cache's path masks the same way
    d = c.head_dim
    for got in (masked[0], cached[0]):
        assert torch.equal(got[..., d:2 * d], torch.zeros_like(got[..., d:2 * d]))
        keep = torch.cat([got[..., :d], got[..., 2 * d:]], -1)
        assert torch.allclose(keep, torch.cat([plain[0][..., :d], plain[0][..., 2 * d:]], -1), atol=1e-12)
    assert not torch.allclose(masked[1], plain[1])  # the next layer hears the change
    assert all(b.attn.head_mask is None for b in model.blocks)  # left as it was: nothing to pay afterwards
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


def test_masks_nest_and_are_checked():
    model = tiny_model("llama")
    a = torch.zeros(2, 4, dtype=torch.bool)
    b = a.clone()
    a[0, 0], b[1, 3] = True, True
    with masked_heads(model, a):
        with masked_heads(model, b):
            assert model.blocks[0].attn.head_mask.tolist() == [True, False, False, False]
            assert model.blocks[1].attn.head_mask.tolist() == [False, False, False, True]
        assert model.blocks[1].attn.head_mask is None
    with pytest.raises(ValueError, match=r"heads must be a bool mask \[layers, heads\] = \(2, 4\)"):
        with masked_heads(model, torch.zeros(2, 3, dtype=torch.bool)):
            pass


def _synthetic_maps(n_kv: int):
    """A prompt whose needle (positions 4..8) holds answer tokens [7, 8, 9]; token 7 also stands outside it (at 1).
    Slots are cached out of position order. Head 0 copies, head 1 rests on the sink, head 2 points at the right
    token outside the needle, head 3 at the needle's wrong token."""
    tokens = torch.tensor([5, 7, 6, 6, 3, 7, 8, 9, 3, 6, 2])
    answer = torch.tensor([7, 8, 9])
    order = torch.tensor([10, 3, 0, 7, 1, 5, 9, 2, 6, 4, 8])  # slot s holds position order[s]
    slot = {int(p): s for s, p in enumerate(order)}
    targets = [[5, 6, 7], [0, 0, 0], [1, 1, 1], [4, 8, 4]]  # the position each head looks at, per answer token
    w = torch.full((4, 3, 11), 0.01)
    for h, row in enumerate(targets):
        for i, p in enumerate(row):
            w[h, i, slot[p]] = 0.9
    return w, order.expand(n_kv, 11), tokens, answer


@pytest.mark.parametrize("n_kv", [4, 1])  # one KV head per query head, and all four sharing one
def test_a_copying_head_scores_one_and_the_others_zero(n_kv):
    w, positions, tokens, answer = _synthetic_maps(n_kv)
    hits = copy_hits(w, positions, tokens, answer, (4, 9))
    assert hits.float().mean(-1).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert copy_hits(w, positions, tokens, answer, (6, 9))[0].tolist() == [False, True, True]  # 5 is outside now
    with pytest.raises(ValueError, match="one row per token"):
        copy_hits(w, positions, tokens, answer[:2], (4, 9))


def _tiny_trials(model, n: int = 2) -> list[NeedleTrial]:
    gen = torch.Generator().manual_seed(0)
    trials = []
    for _ in range(n):
        ids = torch.randint(0, model.config.vocab_size, (40,), generator=gen)
        trials.append(NeedleTrial(ids[None, :34], ids[34:], (10, 20), 0.3, "k"))
    return trials


def test_retrieval_scores_through_the_cache_equal_those_of_plain_attention_maps(family):
    model = tiny_model(family)
    trials = _tiny_trials(model)
    scores = retrieval_scores(model, trials)
    expected = []
    for t in trials:  # independent: one plain causal forward over prompt + answer, its rows read by position
        ids = torch.cat([t.prompt[0], t.answer[:-1]])
        with torch.no_grad():
            maps = model(ids[None], output_attentions=True).attentions
        p, a = t.prompt.shape[1], t.answer.shape[0]
        rows = []
        for w in maps:
            top = w[0, :, p - 1 : p - 1 + a].argmax(-1)  # [H, A] positions
            rows.append((((top >= 10) & (top < 20)) & (ids[top] == t.answer[None])).double().mean(-1))
        expected.append(torch.stack(rows))
    assert scores.shape == (model.config.n_layer, model.config.n_head)
    assert torch.allclose(scores.double(), torch.stack(expected).mean(0))
    with pytest.raises(ValueError, match="trials is empty"):
        retrieval_scores(model, [])


def test_kv_head_scores_take_the_best_query_head_of_each_group():
    scores = torch.tensor([[0.1, 0.9, 0.0, 0.2], [0.3, 0.3, 0.5, 0.0]], dtype=torch.float64)
    assert kv_head_scores(scores, 2).tolist() == [[0.9, 0.2], [0.3, 0.5]]
    assert torch.equal(kv_head_scores(scores, 4), scores)
    with pytest.raises(ValueError, match="n_kv_heads must divide the 4 query heads"):
        kv_head_scores(scores, 3)


def test_top_heads_and_how_concentrated_the_scores_are():
    scores = torch.zeros(4, 5)
    scores[2, 3], scores[0, 1], scores[1, 1] = 0.8, 0.15, 0.05
    assert top_heads(scores, 2).nonzero().tolist() == [[0, 1], [2, 3]]
    assert top_share(scores, 0.05) == pytest.approx(0.8)  # ceil(0.05 · 20) = 1 head
    assert top_share(scores, 0.1) == pytest.approx(0.95) and top_share(torch.zeros(3, 3), 0.1) == 0.0
    with pytest.raises(ValueError, match="k must be between 0 and 20"):
        top_heads(scores, 21)


def test_random_heads_avoid_the_excluded_and_repeat_with_their_seed():
    scores = torch.rand(6, 8)
    top = top_heads(scores, 10)
    draw = random_heads(scores, 10, seed=3, exclude=top)
    assert draw.shape == scores.shape and int(draw.sum()) == 10 and not (draw & top).any()
    assert torch.equal(draw, random_heads(scores, 10, seed=3, exclude=top))
    assert not torch.equal(draw, random_heads(scores, 10, seed=4, exclude=top))
    assert not torch.equal(draw, random_heads(scores, 10, seed=3, exclude=top, split="exploration"))
    assert int(random_heads(scores, 38, seed=0, exclude=top).sum()) == 38  # every head left
    with pytest.raises(ValueError, match="k must be between 0 and 38"):
        random_heads(scores, 39, exclude=top)
    with pytest.raises(ValueError, match="exclude must be a bool mask"):
        random_heads(scores, 1, exclude=torch.zeros(6, 7, dtype=torch.bool))


@pytest.mark.slow
def test_on_smollm2_masking_the_top_retrieval_heads_loses_the_answer(smollm2):
    model, tok, _ = smollm2
    trials = make_needle_trials(tok, 2, 200, seed=5, model=model)
    scores = retrieval_scores(model, trials)
    assert scores.max() >= 0.5 and top_share(scores, 0.1) > 0.5  # a trained model has a few copying heads
    none = needle_accuracy_masked(model, trials, torch.zeros_like(scores, dtype=torch.bool))
    full = needle_eval(model, trials, lambda t: FullCache(), progress=False)
    assert none["accuracy"] == full["accuracy"] and none["low"] <= none["accuracy"] <= none["high"]
    top = needle_accuracy_masked(model, trials, top_heads(scores, 8))
    assert top["masked"] == 8 and top["mean_answer_logprob"] < none["mean_answer_logprob"] - 3
    assert head_sink_mass(model, trials[0].prompt).shape == scores.shape


def test_the_streaming_mask_keeps_sinks_and_a_window():
    m = streaming_mask(6, sinks=1, window=2)
    assert m.int().tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                                [1, 0, 1, 1, 0, 0], [1, 0, 0, 1, 1, 0], [1, 0, 0, 0, 1, 1]]
    with pytest.raises(ValueError, match="window >= 1"):
        streaming_mask(6, 1, 0)


def test_a_gate_of_one_attends_fully_and_of_zero_only_to_sinks_and_window():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, 10, 4, generator=gen, dtype=torch.float64) for n in (4, 2, 2))
    y, w = gated_attention(torch.tensor([1.0, 0.0]), sinks=2, window=3)(q, k, v, causal=True)
    full = torch.softmax((q[:, :2] @ k[:, :1].transpose(-1, -2) / 2).masked_fill(~torch.ones(10, 10).tril().bool(),
                                                                                 float("-inf")), -1) @ v[:, :1]
    i, j = torch.arange(10)[:, None], torch.arange(10)[None]
    seen = (j <= i) & ((j < 2) | (i - j < 3))  # written out again, not streaming_mask
    stream = torch.softmax((q[:, 2:] @ k[:, 1:].transpose(-1, -2) / 2).masked_fill(~seen, float("-inf")), -1) @ v[:, 1:]
    assert w is None and torch.allclose(y[:, :2], full) and torch.allclose(y[:, 2:], stream)
    half, _ = gated_attention(torch.tensor([0.5, 0.5]), sinks=2, window=3)(q, k, v, causal=True)
    ones, _ = gated_attention(torch.ones(2), sinks=2, window=3)(q, k, v, causal=True)
    zeros, _ = gated_attention(torch.zeros(2), sinks=2, window=3)(q, k, v, causal=True)
    assert torch.allclose(half, (ones + zeros) / 2)


def test_gated_heads_leave_the_model_as_it_was(family):
    model = tiny_model(family)
    c = model.config
    ids = torch.randint(0, c.vocab_size, (1, 20))
    with torch.no_grad():
        plain = model(ids).logits
        with gated_heads(model, torch.ones(c.n_layer, c.n_kv_head)):
            assert torch.allclose(model(ids).logits, plain)
        with gated_heads(model, torch.zeros(c.n_layer, c.n_kv_head), sinks=0, window=20):
            assert torch.allclose(model(ids).logits, plain)  # a window over everything is full attention
        with gated_heads(model, torch.zeros(c.n_layer, c.n_kv_head), sinks=1, window=2):
            assert not torch.allclose(model(ids).logits, plain)
        assert torch.equal(model(ids).logits, plain)
        gated = gated_heads(model, torch.zeros(c.n_layer, c.n_kv_head))
        with gated, pytest.raises(ValueError, match="without a cache"):
            model(ids, cache=model.new_cache(1))  # a cache would bypass the gates: refused, not ignored
    with pytest.raises(ValueError, match="gates must be"):
        with gated_heads(model, torch.ones(c.n_layer, c.n_kv_head + 1)):
            pass


def test_gates_fall_where_streaming_loses_nothing_and_stay_where_nothing_pulls(family):
    model = tiny_model(family)
    weights = [p.clone() for p in model.parameters()]
    trials = _tiny_trials(model)
    shape = (model.config.n_layer, model.config.n_kv_head)
    kept = optimize_gates(model, trials, steps=5, lr=0.1, l1=0.0, window=4)
    assert torch.equal(kept, torch.ones(shape))  # at 1 the model is the full model: no gradient without L1
    dropped = optimize_gates(model, trials, steps=15, lr=0.1, l1=0.05, window=64)  # the window covers the prompt
    assert torch.equal(dropped, torch.zeros(shape))
    assert all(torch.equal(p, w) and p.requires_grad for p, w in zip(model.parameters(), weights))
    with pytest.raises(ValueError, match="steps must be >= 1"):
        optimize_gates(model, trials, steps=0)
