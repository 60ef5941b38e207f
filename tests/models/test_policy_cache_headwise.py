"""``PolicyCache`` under a ``HeadwisePolicy``: transformers' attention over heads that hold different lengths (the
ragged parts stored, a padded view with a mask per head handed to attention) gives the course model's logits in
float64 through ``generate()``, in both families and both attention implementations; in bfloat16 and float16 over
a long ``generate()`` every cached key is the float32 rotation of the key as it arrived, to one rounding."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from course.compression import compress_prompt
from course.headwise import HeadPlan, HeadwiseCache, HeadwisePolicy, Part, ada_kv, duo_attention, uniform
from course.models import from_transformers
from course.models.llama import rope
from course.policies import FullCache, StreamingLLM
from course.transformers_cache import PolicyCache, UnsupportedCombination, course_config

from .test_policy_cache_half import record_arrivals
from .test_policy_cache_in_use import PAD, THETA, tiny_half
from .test_transformers_cache import LOGITS, small_hf

PROMPT, NEW = 24, 40


def small_gpt2(impl: str):
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=101, n_positions=256, n_embd=64, n_layer=2, n_head=4,
                                    bos_token_id=0, eos_token_id=0, attn_implementation=impl))
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    return hf.double().eval()


def duo(config):
    """Every layer mixes a retrieval head with streaming heads of different windows."""
    retrieval = torch.zeros(config.n_layer, config.n_kv_head, dtype=torch.bool)
    retrieval[0, 0] = retrieval[-1, -1] = True
    windows = 5 + torch.arange(config.n_layer * config.n_kv_head).view(config.n_layer, config.n_kv_head) % 3
    return duo_attention(config, retrieval, 2, windows)


def greedy(hf, ids, policy, tokens=None):
    """``generate`` through a PolicyCache: (tokens [NEW], logits [NEW, V], the slots per head at the end); with
    ``tokens``, those are forced (the logits of another cache over the same continuation)."""
    def forced(batch_id, sequence):
        return [int(tokens[sequence.shape[-1] - ids.shape[1]])]

    with PolicyCache(hf, policy) as cache:
        out = hf.generate(ids, cache=cache, max_new_tokens=NEW, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, eos_token_id=None, pad_token_id=0,
                          attention_mask=torch.ones_like(ids),
                          prefix_allowed_tokens_fn=None if tokens is None else forced)
        assert isinstance(cache.kv, HeadwiseCache)
        slots = cache.kv.slots_per_head()
    return out.sequences[0, ids.shape[1]:], torch.stack(out.logits)[:, 0], slots


@pytest.mark.parametrize("arch,impl,plan", [("llama", "sdpa", "duo"), ("llama", "eager", "duo"),
                                            ("llama", "eager", "adakv"), ("gpt2", "sdpa", "duo"),
                                            ("gpt2", "eager", "adakv")])
def test_generate_equals_the_course_models_logits(arch, impl, plan):
    hf = small_hf("llama", impl) if arch == "llama" else small_gpt2(impl)
    model = from_transformers(hf, f"small-{arch}")
    config = course_config(hf)

    def make():
        return duo(config) if plan == "duo" else ada_kv(config, 8, obs_window=4)

    ids = torch.randint(0, 100, (1, PROMPT), generator=torch.Generator().manual_seed(11))
    tokens, logits, slots = greedy(hf, ids, make())
    cache, first = compress_prompt(model, ids, make())
    ours = [first[0, -1]]
    with torch.inference_mode():
        for t in tokens[:-1]:
            ours.append(model(t.view(1, 1), cache=cache).logits[0, -1])
    diff = (logits - torch.stack(ours)).abs().max().item()
    # the same tokens under the full cache: what the hidden slots change (a mask that let them through would show)
    _, full, _ = greedy(hf, ids, uniform(config, FullCache()), tokens=tokens)
    moved = (full - logits).abs().max().item()
    print(f"{arch} {impl} {plan}: max |logit diff| {diff:.1e} (vs the full cache {moved:.1e}), slots {slots.tolist()}")
    assert diff <= LOGITS < moved  # (LOGITS: the suite's bound, float64 as transformers computes it)
    assert torch.equal(slots, cache.slots_per_head())
    assert len(set(slots.flatten().tolist())) > 1  # the heads really held different lengths


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_half_precision_keys_stay_exact_through_generate(dtype):
    """A retrieval head (full, original positions) beside a StreamingLLM head under positions inside the cache
    (its sinks are rotated again at every step): after a long generate(), each head's every cached key is the
    float32 rotation of the key as it arrived, by its offset, to one rounding of the dtype."""
    hf = tiny_half(dtype)
    plan = HeadPlan(((Part((0,), FullCache()), Part((1,), StreamingLLM(4, 12))),), 2)
    ids = torch.randint(0, PAD, (1, PROMPT), generator=torch.Generator().manual_seed(4))
    new = 1500
    with PolicyCache(hf, HeadwisePolicy(plan)) as cache, torch.inference_mode():
        arrived = record_arrivals(cache)
        hf.generate(ids, cache=cache, max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0,
                    attention_mask=torch.ones_like(ids))
        n = cache.seen
        keys, pos = cache.layers[0].keys.float(), cache.positions(0)  # the padded view of the last step
        everything = torch.cat(arrived[0], dim=2)
        errors, offsets = [], []
        for h, rule in ((0, "original"), (1, "cache")):
            real = pos[0, h] >= 0
            p = pos[0, h][real]
            offset = torch.zeros_like(p) if rule == "original" else p.argsort().argsort() + n - p.numel() - p
            exact = rope(everything[0, h, p].float()[None, None], offset[None, None], THETA).to(dtype).float()[0, 0]
            got = keys[0, h][real]
            errors.append(float(((got - exact).norm(dim=-1) / exact.norm(dim=-1)).max()))
            offsets.append(int(offset.max()))
        slots = cache.kv.slots_per_head()[0].tolist()
    print(f"{dtype}: key error per head {errors}, largest offsets {offsets}, slots per head {slots}")
    assert n == PROMPT + new - 1 and slots == [n, 16]
    assert max(errors) <= torch.finfo(dtype).eps
    assert offsets[0] == 0 and offsets[1] > new // 2  # the streaming head's sinks did move, far


def test_padded_batches_are_refused():
    hf = small_hf("llama")
    ids = torch.randint(0, 100, (2, PROMPT))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with PolicyCache(hf, duo(course_config(hf))) as cache, pytest.raises(UnsupportedCombination, match="padding"):
        hf.generate(ids, cache=cache, attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=0)


def test_beam_search_reorders_every_part():
    """Beam search reorders the rows of every part; its best beam equals the course model's beam-free score of the
    same tokens (each row attends with its own ragged heads)."""
    hf = small_hf("llama")
    model = from_transformers(hf, "small-llama")
    config = course_config(hf)
    ids = torch.randint(0, 100, (1, PROMPT), generator=torch.Generator().manual_seed(12))
    with PolicyCache(hf, duo(config)) as cache:
        out = hf.generate(ids, cache=cache, max_new_tokens=12, num_beams=3, do_sample=False, eos_token_id=None,
                          pad_token_id=0, attention_mask=torch.ones_like(ids), output_scores=True,
                          return_dict_in_generate=True)
        assert cache.kv.shape[1] == 3
    best = out.sequences[0]
    cache, logits = compress_prompt(model, ids, duo(config))
    total = torch.log_softmax(logits[0, -1], -1)[best[PROMPT]]
    with torch.inference_mode():
        for i in range(PROMPT, best.shape[0] - 1):
            step = model(best[i : i + 1].view(1, 1), cache=cache).logits[0, -1]
            total = total + torch.log_softmax(step, -1)[best[i + 1]]
    # (generate's sequence score is float32, the mean log-probability over the new tokens)
    assert abs(float(total) - float(out.sequences_scores[0]) * (best.shape[0] - PROMPT)) < LOGITS
