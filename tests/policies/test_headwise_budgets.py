"""Head-wise and layer-wise budgets (``course.headwise``): PyramidKV's schedule, Ada-KV's allocation, DuoAttention
at a byte total: exact slot totals, the rules on hand-made scores, refusals by parameter, and the evaluators
(``compare_after_compression``, ``needle_eval``) running head-wise caches beside the uniform ones."""

from __future__ import annotations

import pytest
import torch

from course.evaluate import compare_after_compression, make_needle_trials, needle_eval
from course.headwise import (HeadwiseCache, adakv_counts, adakv_keep, ada_kv, duo_at_bytes, duo_attention,
                             pyramid_budgets, pyramid_kv)
from course.policies import SnapKV, make_policy

from ..conftest import tiny_model

PROMPT = 40


def test_pyramid_budgets_follow_kvpress_and_sum_exactly():
    # 2B - B/beta down to B/beta: 150, 116.67, 83.33, 50 (kvpress rounds each: 150, 117, 83, 50)
    assert pyramid_budgets(4, 100, obs_window=8, beta=2) == [150, 117, 83, 50]
    for layers, budget, beta in [(30, 128, 4), (30, 64, 2), (7, 33, 3.5), (2, 12, 1)]:
        budgets = pyramid_budgets(layers, budget, obs_window=4, beta=beta)
        assert sum(budgets) == layers * budget
        assert budgets == sorted(budgets, reverse=True) and budgets[0] > budgets[-1] or beta == 1
    # the last layer would keep fewer than the observation window: every layer keeps the budget (kvpress: SnapKV)
    assert pyramid_budgets(4, 100, obs_window=8, beta=20) == [100] * 4
    assert pyramid_budgets(1, 50) == [50]


@pytest.mark.parametrize("kwargs,name", [({"n_layers": 0}, "n_layers"), ({"budget": 0}, "budget"),
                                         ({"obs_window": 0}, "obs_window"), ({"beta": 0.5}, "beta")])
def test_pyramid_budgets_refuse_by_name(kwargs, name):
    args = {"n_layers": 4, "budget": 100, "obs_window": 8, "beta": 2} | kwargs
    with pytest.raises(ValueError, match=name):
        pyramid_budgets(**args)


def test_adakv_one_top_k_over_the_layers_heads():
    scores = torch.tensor([[[10.0, 9, 8, 7, 6, 5], [1.0, 0.5, 0.4, 0.3, 0.2, 0.1]]])
    # safeguard 1 slot per head (int(3 * 0.34) = 1): head 1 keeps its best, head 0 the other five of 2 x 3
    assert adakv_counts(scores, 3, safeguard=0.34).tolist() == [[5, 1]]
    assert adakv_counts(scores, 3, safeguard=0.67).tolist() == [[4, 2]]
    assert adakv_counts(scores, 3, safeguard=1.0).tolist() == [[3, 3]]  # all safeguard: SnapKV's uniform budget
    keep = adakv_keep(scores, 3, safeguard=0.34)
    assert keep[0, 0].tolist() == [True] * 5 + [False] and keep[0, 1].tolist() == [True] + [False] * 5
    g = torch.Generator().manual_seed(0)
    for budget in (1, 5, 17):
        counts = adakv_counts(torch.rand(3, 4, 40, generator=g), budget)
        assert counts.sum(-1).tolist() == [4 * budget] * 3
        assert bool((counts >= max(1, int(budget * 0.2))).all())
    assert adakv_counts(scores, 6).tolist() == [[6, 6]]  # nothing to drop


def test_adakv_refuses_by_name():
    with pytest.raises(ValueError, match="safeguard"):
        adakv_counts(torch.rand(1, 2, 8), 3, safeguard=1.5)
    with pytest.raises(ValueError, match="budget"):
        adakv_counts(torch.rand(1, 2, 8), 0)
    with pytest.raises(ValueError, match="scores"):
        adakv_counts(torch.rand(2, 8), 3)
    with pytest.raises(ValueError, match="safeguard"):
        ada_kv(tiny_model("llama").config, 8, safeguard=-0.1)


def test_ada_kv_keeps_each_heads_best_snapkv_scores(family):
    """The cache keeps, per head, exactly the slots ``adakv_keep`` picks from SnapKV's own scores of the prompt."""
    model = tiny_model(family)
    ids = torch.randint(0, 97, (1, PROMPT), generator=torch.Generator().manual_seed(7))
    budget, window = 8, 4
    cache = model.new_cache(1, ada_kv(model.config, budget, obs_window=window))
    scored = model.new_cache(1, SnapKV(budget, window, 7))  # the same votes, not yet compressed
    with torch.no_grad():
        model(ids, cache=cache)
        model(ids, cache=scored)
    cache.compress()
    for layer in range(model.config.n_layer):
        keep = adakv_keep(scored.layers[layer].stat("snapkv"), budget)
        positions = scored.layers[layer].live()[2]
        for h, kept in enumerate(cache.kept_positions(layer)):
            assert torch.equal(kept, positions[0, h][keep[0, h]].sort().values)
    assert cache.slots_per_head().sum(1).tolist() == [budget * model.config.n_kv_head] * model.config.n_layer


def test_pyramid_kv_holds_its_layers_budgets(family):
    model = tiny_model(family)
    policy = pyramid_kv(model.config, 12, obs_window=4, beta=2)
    cache = model.new_cache(1, policy)
    with torch.no_grad():
        model(torch.randint(0, 97, (1, PROMPT), generator=torch.Generator().manual_seed(8)), cache=cache)
    cache.compress()
    budgets = pyramid_budgets(model.config.n_layer, 12, 4, 2)
    assert budgets == [18, 6]
    assert cache.slots_per_head().tolist() == [[b] * model.config.n_kv_head for b in budgets]
    assert cache.bytes_at(2) == 2 * sum(budgets) * model.config.n_kv_head * model.config.head_dim * 2


@pytest.mark.parametrize("budget", [5, 12, 20, 30, 39])
def test_duo_at_bytes_holds_exactly_the_uniform_budgets_slots(family, budget):
    model = tiny_model(family)
    c = model.config
    scores = torch.rand(c.n_layer, c.n_kv_head, generator=torch.Generator().manual_seed(budget))
    policy = duo_at_bytes(c, scores, PROMPT, budget, sinks=2)
    cache = model.new_cache(1, policy)
    with torch.no_grad():
        model(torch.randint(0, 97, (1, PROMPT), generator=torch.Generator().manual_seed(9)), cache=cache)
    cache.compress()
    slots = cache.slots_per_head()
    assert int(slots.sum()) == c.n_layer * c.n_kv_head * budget
    full = slots == PROMPT
    streaming = slots[~full]
    assert int(streaming.max() - streaming.min()) <= 1 if streaming.numel() else True
    # the retrieval heads are the best scored; one more would not fit
    if bool(full.any()) and bool((~full).any()):
        assert float(scores[full].min()) >= float(scores[~full].max())
    n_full = int(full.sum())
    assert (n_full + 1) * PROMPT + (c.n_layer * c.n_kv_head - n_full - 1) * 3 > c.n_layer * c.n_kv_head * budget


def test_duo_builders_refuse_by_name():
    c = tiny_model("llama").config
    scores = torch.rand(c.n_layer, c.n_kv_head)
    with pytest.raises(ValueError, match="budget"):
        duo_at_bytes(c, scores, PROMPT, PROMPT, sinks=2)
    with pytest.raises(ValueError, match="budget"):
        duo_at_bytes(c, scores, PROMPT, 2, sinks=2)
    with pytest.raises(ValueError, match="head_scores"):
        duo_at_bytes(c, scores[:1], PROMPT, 10)
    with pytest.raises(ValueError, match="prompt_tokens"):
        duo_at_bytes(c, scores, 3, 10, sinks=2)
    with pytest.raises(ValueError, match="retrieval"):
        duo_attention(c, scores, window=4)  # not bool
    with pytest.raises(ValueError, match="window"):
        duo_attention(c, scores > 2, window=0)
    with pytest.raises(ValueError, match="sinks"):
        duo_attention(c, scores > 2, sinks=-1)


def test_a_headwise_cache_shares_the_prompt_forward_with_uniform_caches():
    """compare_after_compression runs every contender from one prompt forward (a CacheGroup): a head-wise cache
    among uniform ones scores as it does alone."""
    model = tiny_model("llama")
    c = model.config
    ids = torch.randint(0, 97, (1, PROMPT + 6), generator=torch.Generator().manual_seed(10))
    prompt, cont = ids[:, :PROMPT], ids[:, PROMPT:]
    contenders = {"duo": lambda: duo_at_bytes(c, torch.rand(2, 2, generator=torch.Generator().manual_seed(0)),
                                              PROMPT - 1, 16, sinks=2),
                  "ada": lambda: ada_kv(c, 16, obs_window=4), "snapkv": lambda: make_policy("snapkv", 16, model=c)}
    def held(cache) -> dict:
        return {"bytes": cache.bytes_at(2)}

    together = compare_after_compression(model, prompt, cont, {k: f() for k, f in contenders.items()}, held)
    for name, make in contenders.items():
        alone = compare_after_compression(model, prompt, cont, {name: make()}, held)
        assert torch.allclose(together[name][0], alone[name][0], atol=1e-10, rtol=0)
        assert together[name][2] == alone[name][2] == {"bytes": 2 * 16 * c.n_layer * c.n_kv_head * c.head_dim * 2}


@pytest.mark.slow
def test_needle_prompts_run_through_headwise_policies(smollm2):
    """The real SmolLM2-135M (GQA, 9 query heads per KV head): needle_eval with head-wise policies at 64 slots per
    head; every contender holds the bytes of a uniform 64."""
    model, tok, _ = smollm2
    c = model.config
    trials = make_needle_trials(tok, 1, context_tokens=200, seed=3, model=model)
    p = trials[0].prompt.shape[1] - 1
    scores = torch.rand(c.n_layer, c.n_kv_head, generator=torch.Generator().manual_seed(0))
    for make in (lambda t: duo_at_bytes(c, scores, p, 64), lambda t: ada_kv(c, 64),
                 lambda t: pyramid_kv(c, 64, beta=4)):
        result = needle_eval(model, trials, make, progress=False)
        assert 0.0 <= result["needle_kept"] <= 1.0 and result["trials"][0]["cache_slots"] <= p
    cache = model.new_cache(1, duo_at_bytes(c, scores, p, 64))
    assert isinstance(cache, HeadwiseCache)
    with torch.inference_mode():
        model(trials[0].prompt[:, :-1], cache=cache)
    cache.compress()
    assert int(cache.slots_per_head().sum()) == c.n_layer * c.n_kv_head * 64
