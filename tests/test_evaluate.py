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


def test_full_cache_finds_the_needle_and_streaming_loses_it(smollm2):
    model, tok, _ = smollm2
    trials = make_needle_trials(tok, 2, 300, depth=0.2, seed=0)
    full = needle_eval(model, trials, lambda t: FullCache(), progress=False)
    assert full["accuracy"] == 1.0 and full["needle_kept"] == 1.0
    stream = needle_eval(model, trials, lambda t: StreamingLLM(4, 60), progress=False)
    assert stream["needle_kept"] == 0.0 and stream["mean_answer_logprob"] < full["mean_answer_logprob"] - 5


def test_score_needle_compresses_to_the_budget(smollm2):
    model, tok, _ = smollm2
    t = make_needle_trials(tok, 1, 200, depth=0.5, seed=3)[0]
    r = score_needle(model, t, SnapKV(48))
    assert r["cache_slots"] == 48 and 0.0 <= r["needle_kept"] <= 1.0 and r["logprob"] <= 0.0


def test_continuation_nll_with_full_cache_equals_plain_forward():
    from course.evaluate import continuation_nll

    from .conftest import tiny_model

    model = tiny_model("llama")
    ids = torch.randint(0, 97, (2, 30))
    nll = continuation_nll(model, ids, 20, FullCache())
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[:, 19:-1].double(), -1)
    ref = -lp.gather(-1, ids[:, 20:, None])[..., 0]
    assert nll.shape == (2, 10) and torch.allclose(nll.double(), ref, atol=1e-6)
    with pytest.raises(ValueError, match="context must be between"):
        continuation_nll(model, ids, 30)
