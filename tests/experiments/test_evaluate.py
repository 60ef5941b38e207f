"""Needle prompts and scoring."""

from __future__ import annotations

import pytest
import torch

from course.evaluate import make_needle_trials, needle_eval, score_needle
from course.policies import FullCache, SnapKV, StreamingLLM


def test_needle_prompt_structure(smollm2):
    tok = smollm2[1]
    trials = make_needle_trials(tok, 3, 200, depth=0.5, seed=1)
    for t in trials:
        lo, hi = t.needle
        assert t.key in tok.decode(t.prompt[0, lo:hi])
        assert tok.decode(t.prompt[0]).endswith("The secret passkey is")
        assert tok.decode(t.answer).strip() == t.key
        assert 0.4 < lo / t.prompt.shape[1] < 0.6
    assert trials[0].key != trials[1].key
    with pytest.raises(ValueError, match="depth"):
        make_needle_trials(tok, 1, 200, depth=2.0)


@pytest.mark.slow
def test_full_cache_finds_the_needle_and_streaming_loses_it(smollm2):
    model, tok, _ = smollm2
    trials = make_needle_trials(tok, 2, 300, depth=0.2, seed=0)
    full = needle_eval(model, trials, lambda t: FullCache(), progress=False)
    assert full["accuracy"] >= 0.5 and full["needle_kept"] == 1.0  # a 135M model misses a passkey now and then
    stream = needle_eval(model, trials, lambda t: StreamingLLM(4, 60), progress=False)
    assert stream["needle_kept"] == 0.0 and stream["mean_answer_logprob"] < full["mean_answer_logprob"] - 5


def test_score_needle_compresses_to_the_budget(smollm2):
    model, tok, _ = smollm2
    t = make_needle_trials(tok, 1, 200, depth=0.5, seed=3)[0]
    r = score_needle(model, t, SnapKV(48))
    assert r["cache_slots"] == 48 and 0.0 <= r["needle_kept"] <= 1.0 and r["logprob"] <= 0.0


def test_continuation_nll_with_full_cache_equals_plain_forward():
    from course.evaluate import continuation_nll

    from tests.conftest import tiny_model

    model = tiny_model("llama")
    ids = torch.randint(0, 97, (2, 30))
    nll = continuation_nll(model, ids, 20, FullCache())
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[:, 19:-1].double(), -1)
    ref = -lp.gather(-1, ids[:, 20:, None])[..., 0]
    assert nll.shape == (2, 10) and torch.allclose(nll.double(), ref, atol=1e-6)
    with pytest.raises(ValueError, match="context must be between"):
        continuation_nll(model, ids, 30)


def _contenders(model) -> dict:
    from course.policies import make_policy, policy_names

    out = {name: make_policy(name, 12, model=model) if name != "full" else make_policy("full") for name in policy_names()}
    out["h2o-mean, 2 pinned"] = make_policy("h2o-mean", 12, sinks=2, model=model)
    out["snapkv avg"] = make_policy("snapkv", 12, obs_window=4, pooling="avg", model=model)
    return out


def test_one_prompt_forward_serves_every_contender_exactly(family):
    """compress_prompts: the group's shared forward leaves every cache exactly as compressing alone does."""
    from course.compression import compress_prompt, compress_prompts

    from tests.conftest import tiny_model

    model = tiny_model(family)
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(1))
    names = list(_contenders(model))
    caches, logits = compress_prompts(model, ids, list(_contenders(model).values()))
    for name, grouped in zip(names, caches):
        alone, alone_logits = compress_prompt(model, ids, _contenders(model)[name])
        assert torch.equal(alone_logits, logits)
        for a, g in zip(alone.layers, grouped.layers):
            for x, y in zip(a.live(), g.live()):
                assert torch.equal(x, y), name
        assert grouped.n_slots == (40 if name == "full" else 12)


def test_the_prompt_runs_once_for_all_contenders(monkeypatch):
    from course.evaluate import compare_continuations

    from tests.conftest import tiny_model

    model = tiny_model("llama")
    prompt_forwards = []
    original = type(model).forward

    def counting(self, ids, *a, **kw):
        if ids.shape[1] > 1:
            prompt_forwards.append(ids.shape)
        return original(self, ids, *a, **kw)

    monkeypatch.setattr(type(model), "forward", counting)
    ids = torch.randint(0, 97, (1, 30))
    nll = compare_continuations(model, ids, 20, _contenders(model))
    assert len(prompt_forwards) == 1 and set(nll) == set(_contenders(model))
    assert all(v.shape == (1, 10) for v in nll.values())


def test_a_cache_group_refuses_caches_that_would_attend_differently():
    from course.kvcache import CacheGroup
    from course.policies import make_policy

    from tests.conftest import tiny_model

    model = tiny_model("llama")
    with pytest.raises(ValueError, match="at least one"):
        CacheGroup([])
    with pytest.raises(ValueError, match="chunks='prompt'"):
        CacheGroup([model.new_cache(1, None, chunks="stream")])
    with pytest.raises(ValueError, match="one shape"):
        CacheGroup([model.new_cache(1), model.new_cache(2)])
    a, b = model.new_cache(1, make_policy("window", 4, model=model)), model.new_cache(1)
    ids = torch.randint(0, 97, (1, 6))
    with torch.no_grad():
        for t in range(5):  # the window evicts, the full cache does not: their next views differ
            model(ids[:, t : t + 1], cache=a)
            model(ids[:, t : t + 1], cache=b)
        with pytest.raises(ValueError, match="attend differently"):
            model(ids[:, 5:6], cache=CacheGroup([a, b]))
