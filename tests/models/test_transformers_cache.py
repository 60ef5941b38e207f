"""The course's policies inside transformers' ``generate`` (``course.transformers_cache``): the same tokens and
logits as the course's own decode, a cache held at its budget, and refusals by name.

Sameness is asked in float64 (see tests/models/test_models.py): transformers' forward with the course's policy must be
the computation the course's own model does with it. Two float32 steps remain on transformers' side whatever the
dtype: ``generate`` hands out its logits in float32 (~1e-6 on SmolLM2's logits), and eager attention, which H2O
and SnapKV need for their weights, takes its softmax in float32 (~1e-5 on the logits over 30 layers). Both are far
below the 1e-4 per-step tolerance, while a key at a wrong position or a wrong victim moves logits by far more.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessorList,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from course.compression import compress_prompt
from course.generate import generate
from course.models import from_transformers
from course.policies import StreamingLLM, make_policy
from course.transformers_cache import PolicyCache, UnsupportedCombination, course_config

from tests.conftest import float64_reference

LOGITS = 1e-4  # per step, max |difference| of the logits (fixed before any run)
BUDGET = 16
NEW = 4 * BUDGET  # generate four times the cache
SMALL = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)
ROPE = {"rope_type": "default", "rope_theta": 10000.0}


@contextlib.contextmanager
def attention(hf, impl: str):
    """Run ``hf`` with another attention implementation for a while (the session's model is shared)."""
    before = hf.config._attn_implementation
    hf.config._attn_implementation = impl
    try:
        yield hf
    finally:
        hf.config._attn_implementation = before


class SlotRecorder:
    """A logits processor that records the cache's slots after every forward (and changes nothing)."""

    def __init__(self, cache: PolicyCache) -> None:
        self.cache, self.slots = cache, []

    def __call__(self, input_ids, scores):
        self.slots.append(self.cache.n_slots)
        return scores


def hf_generate(hf, ids: torch.Tensor, policy, n: int = NEW):
    """Greedy ``generate`` through a PolicyCache: (tokens [n], raw logits [n, V], slots after each forward, the
    cache's positions of layer 0 and its stream length at the end)."""
    with PolicyCache(hf, policy) as cache:
        rec = SlotRecorder(cache)
        out = hf.generate(ids, cache=cache, max_new_tokens=n, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, logits_processor=LogitsProcessorList([rec]),
                          eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(ids))
        end = (cache.positions(), cache.seen)
    return out.sequences[0, ids.shape[1]:], torch.stack(out.logits)[:, 0], rec.slots, end


def course_decode(model, tok, ids: torch.Tensor, policy_factory, n: int = NEW):
    """The course's own greedy decode: tokens from ``course.generate`` and, fed the same tokens, the logits of
    every step [n, V] and the final cache."""
    tokens = torch.tensor([s.token for s in generate(model, tok, ids, policy_factory(), max_new_tokens=n,
                                                     ignore_eos=True)])
    cache, logits = compress_prompt(model, ids, policy_factory())
    steps = [logits[0, -1]]
    with torch.inference_mode():
        for t in tokens[:-1]:
            steps.append(model(t.view(1, 1).to(model.device), cache=cache).logits[0, -1])
    return tokens, torch.stack(steps), cache


def check_same(model, tok, hf, ids, policy_factory, fill: int | None) -> None:
    """Identical tokens, logits within LOGITS at every step, the same cached positions at the end, and (if
    ``fill``) the cache at the budget at every step from ``fill`` on, never above it."""
    ours_tokens, ours_logits, ours_cache = course_decode(model, tok, ids, policy_factory)
    tokens, logits, slots, (positions, seen) = hf_generate(hf, ids, policy_factory())
    diff = (logits.double() - ours_logits.double()).abs().amax(-1)
    print(f"{policy_factory().label}: max |logit diff| per step <= {diff.max():.2e}, slots {slots[:3]}..{slots[-3:]}")
    assert torch.equal(tokens.cpu(), ours_tokens.cpu())
    assert diff.max().item() <= LOGITS
    assert torch.equal(positions.cpu(), ours_cache.positions().cpu())
    assert seen == ours_cache.seen == ids.shape[1] + NEW - 1
    if fill is not None:
        assert max(slots) <= BUDGET and all(s == BUDGET for s in slots[fill:])


# ----------------------------------------------------------------------------- SmolLM2 as LlamaForCausalLM
SMOLLM2_POLICIES = {
    "streaming (cache positions)": ("sdpa", dict(name="streaming")),
    "window (original positions)": ("sdpa", dict(name="window")),
    "h2o": ("eager", dict(name="h2o", sinks=2)),
    "snapkv": ("eager", dict(name="snapkv")),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SMOLLM2_POLICIES))
def test_smollm2_generate_equals_course_decode(case, smollm2, smollm2_f64, austen_ids):
    impl, kw = SMOLLM2_POLICIES[case]
    model, hf = smollm2_f64
    ids = austen_ids[:, :24]  # a prompt longer than the budget: compressed first, then decoded 4x past it
    kw = dict(kw)
    name = kw.pop("name")

    def factory():
        return make_policy(name, BUDGET, model=model, **kw)

    with attention(hf, impl):
        check_same(model, smollm2[1], hf, ids, factory, fill=None if name == "snapkv" else 0)


def test_smollm2_snapkv_compresses_the_prompt_then_grows(smollm2_f64, austen_ids):
    model, hf = smollm2_f64
    with attention(hf, "eager"):
        _, _, slots, _ = hf_generate(hf, austen_ids[:, :40], make_policy("snapkv", BUDGET, model=model), n=4)
    assert slots == [BUDGET, BUDGET + 1, BUDGET + 2, BUDGET + 3]  # after the prompt, then one more per token


# ----------------------------------------------------------------------------- gpt2-random as GPT2LMHeadModel
@pytest.fixture(scope="module")
def gpt2_random_f64(smollm2):
    """gpt2-random's shapes (width 768, 12 heads, 1024 learned positions, SmolLM2's tokenizer) with 3 of its 12
    layers (a short test), as a random transformers GPT2LMHeadModel, and the course's GPT-2 with its weights;
    float64."""
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(smollm2[1]), n_positions=1024, n_embd=768, n_layer=3, n_head=12,
                     bos_token_id=smollm2[1].bos_token_id, eos_token_id=smollm2[1].eos_token_id)
    hf = GPT2LMHeadModel(cfg).double().eval()
    return from_transformers(hf, "gpt2-random"), hf


@pytest.mark.slow
@pytest.mark.parametrize("name,impl", [("streaming", "sdpa"), ("window", "sdpa"), ("h2o", "eager"),
                                       ("snapkv", "eager")])
def test_gpt2_generate_equals_course_decode(name, impl, gpt2_random_f64, smollm2, austen_ids):
    model, hf = gpt2_random_f64

    def factory():
        return make_policy(name, BUDGET, model=model)  # GPT-2: original positions

    assert factory().position_rule == "original"
    with attention(hf, impl):
        check_same(model, smollm2[1], hf, austen_ids[:, :24], factory, fill=None if name == "snapkv" else 0)


def test_gpt2_refuses_position_reassignment(gpt2_random_f64):
    _, hf = gpt2_random_f64
    with pytest.raises(ValueError, match="re-assigns positions.*GPT-2 family"):
        PolicyCache(hf, StreamingLLM(4, 12))  # the cache rule, built by hand
    with pytest.raises(ValueError, match="re-assigns positions.*GPT-2 family"):
        make_policy("window", BUDGET, positions="cache", model=course_config(hf))


# ----------------------------------------------------------------------------- small random Llama, Mistral, Qwen2
def small_hf(arch: str, impl: str = "sdpa"):
    torch.manual_seed(0)
    if arch == "llama":
        hf = LlamaForCausalLM(LlamaConfig(**SMALL, rope_parameters=ROPE, attn_implementation=impl))
    elif arch == "mistral":
        hf = MistralForCausalLM(MistralConfig(**SMALL, rope_parameters=ROPE, sliding_window=None,
                                              attn_implementation=impl))
    else:
        hf = Qwen2ForCausalLM(Qwen2Config(**SMALL, rope_parameters=ROPE, use_sliding_window=False,
                                          attn_implementation=impl))
    with torch.no_grad():  # larger weights: attention far from uniform, so a wrong position shows
        for p in hf.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    return float64_reference(hf.double().eval())


class IdTokenizer:
    """Enough of a tokenizer for ``course.generate`` on random models (text is irrelevant there)."""

    eos_token_id = None

    def decode(self, ids):
        return " ".join(map(str, ids))


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("name,kw,impl", [("streaming", {}, "sdpa"), ("streaming", {"positions": "original"}, "sdpa"),
                                          ("window", {"positions": "cache"}, "sdpa"),
                                          ("h2o", {"sinks": 2, "positions": "cache"}, "eager"),
                                          ("random", {}, "sdpa")])
def test_small_models_stay_within_budget_and_match(arch, name, kw, impl):
    hf = small_hf(arch, impl)
    model = from_transformers(hf)
    ids = torch.randint(0, SMALL["vocab_size"], (1, 10), generator=torch.Generator().manual_seed(1))

    def factory():
        return make_policy(name, BUDGET, model=model, **kw)

    check_same(model, IdTokenizer(), hf, ids, factory, fill=BUDGET - ids.shape[1] + 1)


def test_batch_of_equal_prompts_matches_course():
    hf = small_hf("llama")
    model = from_transformers(hf)
    ids = torch.randint(0, SMALL["vocab_size"], (2, 10), generator=torch.Generator().manual_seed(2))
    cache = PolicyCache(hf, make_policy("streaming", BUDGET, model=model))
    out = hf.generate(ids, past_key_values=cache, max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                      pad_token_id=0)  # the keyword before transformers 5.24 (deprecated there) works as well
    slots = cache.n_slots
    cache.close()
    ours, logits = compress_prompt(model, ids, make_policy("streaming", BUDGET, model=model))
    tokens = [logits[:, -1].argmax(-1)]
    with torch.inference_mode():
        for _ in range(NEW - 1):
            tokens.append(model(tokens[-1][:, None], cache=ours).logits[:, -1].argmax(-1))
    assert torch.equal(out[:, 10:], torch.stack(tokens, 1))
    assert slots == BUDGET


# ----------------------------------------------------------------------------- refusals, by name and before any work
@pytest.mark.parametrize("name", ["h2o", "snapkv"])
def test_weight_policies_refuse_fused_attention(name):
    hf = small_hf("llama", "sdpa")
    with pytest.raises(UnsupportedCombination, match="attn_implementation='eager'.*'sdpa'"):
        PolicyCache(hf, make_policy(name, BUDGET, model=course_config(hf)))


def test_weight_policies_refuse_a_switch_to_fused_attention():
    hf = small_hf("llama", "eager")
    cache = PolicyCache(hf, make_policy("h2o", BUDGET, model=course_config(hf)))
    hf.config._attn_implementation = "sdpa"
    with pytest.raises(UnsupportedCombination, match="eager"):
        hf.generate(torch.ones(1, 5, dtype=torch.long), cache=cache, max_new_tokens=2)
    assert cache.seen == 0


def test_a_second_prompt_on_a_used_cache_is_refused():
    hf = small_hf("llama")
    cache = PolicyCache(hf, make_policy("streaming", BUDGET, model=course_config(hf)))
    with torch.no_grad():
        hf(torch.ones(1, 5, dtype=torch.long), cache=cache)
        with pytest.raises(UnsupportedCombination, match="forward of 3 tokens on a cache that already holds 5"):
            hf(torch.ones(1, 3, dtype=torch.long), cache=cache)


def test_unsupported_models_and_policies_are_refused():
    hf = small_hf("llama")
    hf.config.rope_parameters = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    with pytest.raises(ValueError, match="RoPE scaling 'linear'"):
        PolicyCache(hf, make_policy("streaming", BUDGET))
    with pytest.raises(TypeError, match="course Policy"):
        PolicyCache(small_hf("llama"), "streaming")


def test_hooks_act_only_for_their_own_cache():
    hf = small_hf("llama")
    cache = PolicyCache(hf, make_policy("streaming", BUDGET, model=course_config(hf)))
    ids = torch.ones(1, 5, dtype=torch.long)
    with torch.no_grad():
        plain = hf(ids).logits  # another forward (its own DynamicCache) leaves the policy cache alone
    assert cache.seen == 0
    cache.close()
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, plain)


def test_bench_report_goes_between_markers(tmp_path):
    from course.instructor.transformers_bench import BEGIN, END, write_transformers_cache_report

    def spread(median: float, low: float, high: float) -> dict:
        return {"median": median, "min": low, "max": high}

    rows = [{"context": 64, "ms_per_token": {"dynamic": spread(10.0, 9.0, 11.0), "policy": spread(10.5, 10.0, 12.0),
                                             "course": spread(9.5, 9.0, 10.0)},
             "policy_over_dynamic": spread(1.05, 1.01, 1.09), "course_over_dynamic": spread(0.95, 0.9, 1.02)},
            {"context": 512, "ms_per_token": {"dynamic": spread(20.0, 19.0, 21.0), "policy": spread(24.0, 23.0, 25.0)},
             "policy_over_dynamic": spread(1.2, 1.15, 1.25)}]
    result = {"model": "m", "device": "cpu", "sinks": 4, "steps": 2, "reps": 5,
              "machine": {"processor": "x", "cpu_threads": 2, "torch": "t"}, "rows": rows}
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# B\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    write_transformers_cache_report(result, doc, "python -m course bench --transformers-cache")
    text = doc.read_text()
    assert "old" not in text and text.endswith("after\n") and text.count(BEGIN) == 1
    assert "| 64 | 10.0 (9.0-11.0) | 10.5 (10.0-12.0) | 9.5 (9.0-10.0) | 1.05 (1.01-1.09) | 0.95 (0.90-1.02) |" in text
    assert "| 512 | 20.0 (19.0-21.0) | 24.0 (23.0-25.0) |  | 1.20 (1.15-1.25) |  |" in text
    assert "| PolicyCache / DynamicCache <= 1.1 at 64 tokens | 1.05 (1.01-1.09) | meets it |" in text
    assert "| PolicyCache / DynamicCache <= 1.1 at 512 tokens | 1.20 (1.15-1.25) | **misses it** |" in text
    assert "| course decode / transformers' decode <= 1.0 at 64 tokens | 0.95 (0.90-1.02) | meets it |" in text
    assert "course decode / transformers' decode <= 1.0 at 512" not in text  # not measured there: no verdict
