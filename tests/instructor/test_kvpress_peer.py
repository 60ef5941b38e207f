"""The head-wise caches against an independent peer, NVIDIA's kvpress 0.5.5 (course.instructor.kvpress_peer): the
same SmolLM2-135M weights and the same passkey prompts, the positions each method keeps per layer and KV head.

Where the methods coincide the kept positions must be the same:
* the allocators, fed the same scores: Ada-KV's one top-k over a layer's heads (exactly), PyramidKV's budgets per
  layer (kvpress rounds each layer's budget, the course hands out the remainder so that the layers sum to exactly
  layers x budget: at most one slot apart per layer);
* DuoAttention with the same head pattern: retrieval heads everything, streaming heads sinks + recent (exactly).

Where they differ, the difference is named and measured: SnapKV's scores. Both average the observation window's
attention over each GQA group and pool it over neighbouring positions; kvpress pools by the average with the
prompt's edges padded by zeros (``avg_pool1d``'s count_include_pad), the course by the average over the real
neighbours or, by default, by the maximum. With the course's SnapKV set to kvpress's pooling and kernel, uniform
SnapKV, Ada-KV and PyramidKV keep the slots kvpress keeps but for the prompt's edges (agreement >= 0.99, fixed before
any run: the allocators are the same, checked exactly on shared scores); with the course's default pooling the
agreement is measured and printed, not held to a number.
"""

from __future__ import annotations

import pytest
import torch

from course import assets
from course.compression import compress_prompt
from course.headwise import (HeadPlan, HeadwisePolicy, Part, ada_kv, adakv_counts, adakv_keep, duo_attention,
                             pyramid_budgets, pyramid_kv)
from course.evaluate import make_needle_trials
from course.instructor import kvpress_peer as peer
from course.policies.snapkv import SnapKV

pytestmark = pytest.mark.slow  # kernels, notebooks or the real model at length: not in the contributor suite

BUDGET = 128  # slots per KV head of a ~540-token passkey prompt
PYRAMID_BUDGET = 192  # kvpress's pyramid needs budget >= beta * window (20 * 8), else it falls back to uniform
WINDOW, KERNEL = 8, 5  # the observation window and pooling kernel both sides are given
SNAPKV_SAME = 0.99  # uniform SnapKV, the course set to kvpress's pooling: only the prompt's edges differ


@pytest.fixture(scope="module")
def kvpress():
    try:
        return peer.import_kvpress()
    except ModuleNotFoundError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def sdpa_smollm2(kvpress):
    """(course model, tokenizer, transformers model with sdpa attention): a model of its own, since kvpress's hooks
    leave attributes on the attention modules it runs (kvpress's AdaKV and DuoAttention refuse eager attention)."""
    if not assets.status()["smollm2-135m"]:
        pytest.fail("SmolLM2-135M is not in the course cache: run `python -m course fetch` first")
    from course.models import from_transformers, load_hf_model

    hf, tok = load_hf_model("smollm2-135m", attn="sdpa")
    return from_transformers(hf.eval(), "smollm2-135m"), tok, hf


@pytest.fixture(scope="module")
def prompts(sdpa_smollm2):
    model, tok, _ = sdpa_smollm2
    return [t.prompt for t in make_needle_trials(tok, 2, context_tokens=500, model=model, seed=3)]


def _course_kept(cache) -> list[list[torch.Tensor]]:
    """Kept positions [layer][kv_head] of a course cache: a head-wise one says them, a uniform one holds them."""
    if hasattr(cache, "kept_positions"):
        return [list(cache.kept_positions(layer)) for layer in range(len(cache.layers))]
    return [[layer.positions[0, h, : layer.length].sort().values for h in range(layer.positions.shape[1])]
            for layer in cache.layers]


def _snapkv_agreement(sdpa_smollm2, prompt, pooling: str) -> dict:
    model, _, hf = sdpa_smollm2
    cache, _ = compress_prompt(model, prompt, SnapKV(BUDGET, WINDOW, KERNEL, pooling))
    return peer.agreement(_course_kept(cache), peer.kept_by_press(hf, prompt, peer.snapkv_press(
        BUDGET, prompt.shape[1], window=WINDOW, kernel=KERNEL)))


def test_the_peer_reads_what_kvpress_keeps(sdpa_smollm2, prompts):
    """The reading of kvpress itself: masked keys for DuoAttention and AdaKV, removed keys for PyramidKV."""
    _, _, hf = sdpa_smollm2
    prompt, (n_layers, kv_heads) = prompts[0], (hf.config.num_hidden_layers, hf.config.num_key_value_heads)
    retrieval = torch.zeros(n_layers, kv_heads, dtype=torch.bool)
    retrieval[2, 1] = retrieval[9, 0] = True
    duo = peer.kept_by_press(hf, prompt, peer.duo_attention_press(retrieval, 4, 60))
    p = prompt.shape[1]
    streaming = torch.cat([torch.arange(4), torch.arange(p - 60, p)])
    assert torch.equal(duo[2][1], torch.arange(p)) and torch.equal(duo[2][0], streaming)
    assert all(torch.equal(duo[layer][h], streaming) for layer in (0, 29) for h in range(kv_heads))
    ada = peer.kept_by_press(hf, prompt, peer.ada_kv_press(BUDGET, p, window=WINDOW, kernel=KERNEL))
    assert [sum(len(h) for h in layer) for layer in ada] == [kv_heads * BUDGET] * n_layers
    assert len({len(h) for h in ada[0]}) > 1  # ragged: the heads of a layer keep different numbers
    pyramid = peer.kept_by_press(hf, prompt, peer.pyramid_kv_press(PYRAMID_BUDGET, p, window=WINDOW, kernel=KERNEL))
    assert [len(layer[0]) for layer in pyramid] == peer.kvpress_layer_budgets(n_layers, PYRAMID_BUDGET, p,
                                                                              window=WINDOW)


def test_snapkv_scores_agree_when_the_pooling_is_the_same(sdpa_smollm2, prompts, capsys):
    for prompt in prompts:
        same = _snapkv_agreement(sdpa_smollm2, prompt, "avg")
        default = _snapkv_agreement(sdpa_smollm2, prompt, "max")
        with capsys.disabled():
            print(f"\nSnapKV kept-slot agreement with kvpress (budget {BUDGET}, window {WINDOW}, kernel {KERNEL}): "
                  f"course avg pooling {same}, course max pooling {default}")
        assert same["slots"][0] == same["slots"][1] and same["mean"] >= SNAPKV_SAME


def test_ada_kv_allocation_is_kvpress_s_on_the_same_scores(kvpress):
    g = torch.Generator().manual_seed(0)
    for heads, slots, budget, safeguard in ((3, 200, 40, 0.2), (4, 97, 10, 0.05), (2, 64, 32, 0.5), (3, 540, 128, 0.2)):
        scores = torch.rand(1, heads, slots, generator=g)
        theirs = peer.kvpress_adakv_keep(scores, budget, safeguard)
        assert torch.equal(adakv_keep(scores, budget, safeguard), theirs)
        assert torch.equal(adakv_counts(scores, budget, safeguard), theirs.sum(-1))
        assert int(theirs.sum()) == heads * budget


def test_pyramid_budgets_are_kvpress_s_up_to_its_rounding(kvpress):
    # the last two: budget / beta < window, where both fall back to SnapKV's uniform budget
    for n_layers, budget, prompt in ((30, 192, 540), (30, 200, 1000), (12, 170, 800), (24, 161, 700), (30, 128, 540),
                                     (30, 64, 540)):
        ours = list(pyramid_budgets(n_layers, budget, WINDOW, 20))
        theirs = peer.kvpress_layer_budgets(n_layers, budget, prompt, window=WINDOW)
        assert sum(ours) == n_layers * budget
        assert max(abs(a - b) for a, b in zip(ours, theirs)) <= 1, (ours, theirs)


def test_duo_attention_keeps_the_same_slots(sdpa_smollm2, prompts, capsys):
    model, _, hf = sdpa_smollm2
    c = model.config
    retrieval = torch.rand(c.n_layer, c.n_kv_head, generator=torch.Generator().manual_seed(0)) < 0.15
    for prompt in prompts:
        cache, _ = compress_prompt(model, prompt, duo_attention(c, retrieval, sinks=4, window=60))
        same = peer.agreement(_course_kept(cache), peer.kept_by_press(
            hf, prompt, peer.duo_attention_press(retrieval, 4, 60)))
        with capsys.disabled():
            print(f"\nDuoAttention kept-slot agreement with kvpress: {same}")
        assert same["identical_heads"] == 1.0


def _pooled(policy, pooling: str):
    """The same head-wise plan with its SnapKV parts pooling by ``pooling`` (the builders use SnapKV's default)."""
    plan = policy.plan
    layers = tuple(tuple(Part(p.kv_heads, SnapKV(p.policy.capacity, p.policy.obs_window, p.policy.kernel, pooling))
                         for p in parts) for parts in plan.layers)
    return HeadwisePolicy(HeadPlan(layers, plan.n_kv_heads, plan.allocator), f"{policy.label}, {pooling} pooling")


def test_ada_kv_and_pyramid_kv_keep_the_slots_kvpress_keeps(sdpa_smollm2, prompts, capsys):
    """With kvpress's pooling the plans keep what its presses keep but for the prompt's edges (SNAPKV_SAME, as for
    uniform SnapKV); with the course's default pooling (the maximum) the difference is measured and printed."""
    model, _, hf = sdpa_smollm2
    for prompt in prompts:
        p = prompt.shape[1]
        runs = {"ada_kv": (ada_kv(model.config, BUDGET, obs_window=WINDOW, kernel=KERNEL),
                           peer.ada_kv_press(BUDGET, p, window=WINDOW, kernel=KERNEL)),
                "pyramid_kv": (pyramid_kv(model.config, PYRAMID_BUDGET, obs_window=WINDOW, kernel=KERNEL),
                               peer.pyramid_kv_press(PYRAMID_BUDGET, p, window=WINDOW, kernel=KERNEL))}
        for name, (policy, press) in runs.items():
            theirs = peer.kept_by_press(hf, prompt, press)
            for pooling in ("avg", "max"):
                cache, _ = compress_prompt(model, prompt, _pooled(policy, pooling))
                same = peer.agreement(_course_kept(cache), theirs)
                with capsys.disabled():
                    print(f"\n{name}, course {pooling} pooling: kept-slot agreement with kvpress {same}")
                assert same["slots"][0] == same["slots"][1]
                assert pooling == "max" or same["mean"] >= SNAPKV_SAME
