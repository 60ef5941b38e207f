"""Both model families through every evaluator: at the GPT-2 family's position limit the work runs,
one token past it every public evaluator and sweep refuses before any work, with the limit named;
and every policy goes through one prompt-compression protocol."""

from __future__ import annotations

import pytest
import torch

from course.attention_analysis import attention_maps
from course.compression import compress_prompt
from course.evaluate import (
    NeedleTrial,
    budget_sweep,
    continuation_nll,
    decode_after_compression,
    needle_eval,
)
from course.policies import FullCache, make_policy
from course.streaming import decode_stream, evaluate_stream, exact_stream, recompute_stream
from course.timing import decode_cost_vs_context, streaming_vs_recompute

from tests.conftest import tiny_model

LIMIT = 32  # the tiny GPT-2's position table
LIMIT_MESSAGE = rf"has {LIMIT} \(learned positions 0\.\.{LIMIT - 1}\)"


@pytest.fixture(scope="module")
def gpt2():
    return tiny_model("gpt2", max_positions=LIMIT)


def _trial(n_tokens: int) -> NeedleTrial:
    ids = torch.randint(0, 97, (1, n_tokens - 2))
    return NeedleTrial(ids, torch.randint(0, 97, (2,)), (5, 8), 0.3, "12")


RUNS = {  # name -> run(model, n_tokens): every public evaluator and sweep, sized by its token count
    "decode_stream": lambda m, n: decode_stream(m, torch.randint(0, 97, (1, n)), make_policy("window", 8, model=m),
                                                progress=False),
    "exact_stream": lambda m, n: exact_stream(m, torch.randint(0, 97, (1, n)), make_policy("streaming", 8, model=m),
                                              progress=False),
    "evaluate_stream": lambda m, n: evaluate_stream(m, torch.randint(0, 97, (2, n)), make_policy("h2o", 8, model=m),
                                                    progress=False),
    "recompute_stream (window)": lambda m, n: recompute_stream(m, torch.randint(0, 97, (1, n + 3)), n, progress=False),
    "compress_prompt": lambda m, n: compress_prompt(m, torch.randint(0, 97, (1, n)), make_policy("snapkv", 8, model=m)),
    "continuation_nll": lambda m, n: continuation_nll(m, torch.randint(0, 97, (1, n)), n - 4, FullCache()),
    "decode_after_compression": lambda m, n: decode_after_compression(
        m, torch.randint(0, 97, (1, n - 3)), torch.randint(0, 97, (1, 3)), make_policy("streaming", 8, model=m)),
    "needle_eval": lambda m, n: needle_eval(m, [_trial(n)], lambda t: FullCache(), progress=False),
    "budget_sweep": lambda m, n: budget_sweep(m, [_trial(n)], "h2o", [8, 12], progress=False),
    "attention_maps": lambda m, n: attention_maps(m, torch.randint(0, 97, (1, n))),
    "decode_cost_vs_context": lambda m, n: decode_cost_vs_context(m, torch.randint(0, 97, (1, n)), [8, n - 1], reps=1),
    "streaming_vs_recompute": lambda m, n: streaming_vs_recompute(m, torch.randint(0, 97, (1, n)), 2, n - 7, reps=1),
}


@pytest.mark.parametrize("name", RUNS)
def test_every_evaluator_runs_at_the_position_limit_and_refuses_past_it(gpt2, name):
    RUNS[name](gpt2, LIMIT)  # exactly the limit: runs
    with pytest.raises(ValueError, match=LIMIT_MESSAGE):
        RUNS[name](gpt2, LIMIT + 1)


@pytest.mark.parametrize("name", ["exact_stream", "decode_stream", "decode_after_compression"])
def test_a_rope_model_streams_past_its_trained_context(name):
    llama = tiny_model("llama", max_positions=LIMIT)
    RUNS[name](llama, 2 * LIMIT)  # positions are re-assigned inside the cache: no limit


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("name, sinks", [("window", None), ("streaming", 2), ("h2o", 2), ("snapkv", None),
                                          ("random", 0)])
def test_one_protocol_prompt_runs_with_full_attention_then_the_kept_slots_decide(family, name, sinks):
    """Every policy, position-only ones included: the prompt's logits equal a plain causal forward, and
    after compression the next token's logits equal a fresh forward over exactly the kept tokens (one layer,
    so a cached K/V depends on its own token only), at the positions the policy's rule gives them."""
    model = tiny_model(family, n_layer=1)
    ids = torch.randint(0, 97, (1, 24))
    policy = make_policy(name, 10, sinks=sinks, model=model)
    cache, logits = compress_prompt(model, ids[:, :20], policy)
    with torch.no_grad():
        assert torch.allclose(logits, model(ids[:, :20]).logits, atol=1e-10), "the prompt must see full attention"
        assert cache.n_slots == 10
        if not policy.is_static:
            return  # heads keep different slots: the per-head selection is tested in test_policies.py
        for t in range(20, 24):
            step = model(ids[:, t : t + 1], cache=cache).logits[:, -1]
            kept = cache.positions(0)[0, 0].sort().values  # what the new token attended to, itself included
            assert kept[-1] == t and len(kept) == 10
            rule_positions = kept if policy.position_rule == "original" else torch.arange(len(kept))
            fresh = model(ids[:, kept], positions=rule_positions).logits[:, -1]
            assert torch.allclose(step, fresh, atol=1e-10), (name, t)
