"""``PolicyCache`` as people run it (issue 36): greedy choices in half precision over a long stream, left-padded
batches of prompts, sampling, several sequences per prompt, beam search, a loop of generate calls, and one-line
refusals before any work.

Sameness is still asked in float64 where two computations must agree (a batch row and its prompt alone); half
precision is asked what it can promise: choices that follow float32's as often as DynamicCache's do (and, in
tests/test_policy_cache_half.py, every cached key the float32 rotation of the key as it arrived, to within one
rounding of the dtype, however long the stream).
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, LogitsProcessorList

from course.compression import compress_prompt
from course.models import from_transformers
from course.policies import make_policy
from course.transformers_cache import PolicyCache, UnsupportedCombination, course_config

from .test_transformers_cache import BUDGET, LOGITS, ROPE, SMALL, small_hf

PAD = 100  # a token id no prompt below contains (prompts draw from 0..99)
THETA = ROPE["rope_theta"]


def prompts(lengths, seed: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, PAD, (n,), generator=g) for n in lengths]


def left_padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of prompts padded on the left with PAD, and its attention mask."""
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, n - len(r):], mask[i, n - len(r):] = r, 1
    return ids, mask


def factory_of(name: str, kw: dict, config):
    return lambda: make_policy(name, BUDGET, model=config, **kw)


# ----------------------------------------------------------------------------- half precision over 5,000 tokens
HALF_TOKENS = 5000
def tiny_half(dtype: torch.dtype, impl: str = "sdpa", layers: int = 1):
    """A tiny random transformers Llama (one layer by default: the stream is long) in ``dtype``."""
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**{**SMALL, "num_hidden_layers": layers}, rope_parameters=ROPE,
                                      attn_implementation=impl))
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    return hf.to(dtype).eval()


def forced(hf, ids: torch.Tensor, cache, prompt: int = 8) -> torch.Tensor:
    """The greedy choice after every prefix of a stream fed token by token (teacher forcing): [n - prompt + 1]."""
    with torch.inference_mode():
        out = [hf(ids[:, :prompt], cache=cache).logits[0, -1].argmax()]
        out += [hf(ids[:, t : t + 1], cache=cache).logits[0, -1].argmax() for t in range(prompt, ids.shape[1])]
    return torch.stack(out)


def forced_runs(hf, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Teacher-forced greedy choices of ``hf`` along ``ids``, with DynamicCache and with StreamingLLM in a
    PolicyCache."""
    with PolicyCache(hf, make_policy("streaming", BUDGET, model=course_config(hf))) as cache:
        return {"DynamicCache": forced(hf, ids, DynamicCache()), "PolicyCache": forced(hf, ids, cache)}


@pytest.fixture(scope="module")
def float32_runs():
    """The float32 runs every half-precision run is compared with, and their stream."""
    ids = torch.randint(0, PAD, (1, HALF_TOKENS), generator=torch.Generator().manual_seed(5))
    return ids, forced_runs(tiny_half(torch.float32), ids)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_half_precision_greedy_choices_follow_float32(dtype, float32_runs):
    """Along a 5,000-token stream, the half-precision PolicyCache's greedy choices agree with float32's as often as
    DynamicCache's do with theirs, over the whole stream and over its last 1,000 tokens (a drift of the sinks would
    make them part ever more often as the stream grows).

    Teacher forcing, not free-running runs: the dtype's rounding flips a near-tie within a few dozen free-running
    tokens with either cache (a tiny random model has many), and from there two runs see different streams, so the
    step where each parts is chance, not a measure of the cache."""
    ids, want = float32_runs
    got = forced_runs(tiny_half(dtype), ids)
    rate = {(k, part): float((got[k][sl] == want[k][sl]).double().mean())
            for k in got for part, sl in (("all", slice(None)), ("late", slice(-1000, None)))}
    print(f"{dtype}: the same greedy choice as float32 over {HALF_TOKENS} tokens (over the last 1,000): "
          + ", ".join(f"{k} {rate[k, 'all']:.1%} ({rate[k, 'late']:.1%})" for k in got))
    for part in ("all", "late"):
        assert rate["PolicyCache", part] >= rate["DynamicCache", part] - 0.05


# ----------------------------------------------------------------------------- batches of prompts, left-padded
BATCH_POLICIES = [
    ("full", {}, "sdpa"), ("window", {}, "sdpa"), ("window", {"positions": "cache"}, "sdpa"),
    ("streaming", {}, "sdpa"), ("streaming", {"positions": "original"}, "sdpa"),
    ("h2o", {"sinks": 2}, "eager"), ("h2o", {"sinks": 2, "positions": "cache"}, "eager"), ("h2o-mean", {}, "eager"),
    ("snapkv", {}, "eager"), ("snapkv", {"pooling": "avg"}, "eager"), ("snapkv", {"positions": "cache"}, "eager"),
]
LENGTHS = (5, 11, 2 * BUDGET)  # shorter than the budget, and longer (compressed first)


def generate_rows(hf, ids, mask, policy, n: int = 4 * BUDGET):
    """Greedy generate through one PolicyCache: new tokens [B, n], raw logits [n, B, V], kept positions per layer."""
    with PolicyCache(hf, policy) as cache:
        out = hf.generate(ids, attention_mask=mask, cache=cache, max_new_tokens=n, do_sample=False, pad_token_id=PAD,
                          eos_token_id=None, output_logits=True, return_dict_in_generate=True)
        kept = [cache.positions(i).clone() for i in range(len(cache.layers))]
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits), kept


@pytest.mark.parametrize("name,kw,impl", BATCH_POLICIES,
                         ids=[f"{n}-{'-'.join(map(str, kw.values())) or 'default'}" for n, kw, _ in BATCH_POLICIES])
def test_each_row_of_a_padded_batch_is_its_prompt_alone(name, kw, impl):
    hf = small_hf("llama", impl)
    make = factory_of(name, kw, course_config(hf))
    rows = prompts(LENGTHS)
    ids, mask = left_padded(rows)
    tokens, logits, kept = generate_rows(hf, ids, mask, make())
    for i, row in enumerate(rows):
        alone, alone_logits, alone_kept = generate_rows(hf, row[None], torch.ones(1, len(row), dtype=torch.long),
                                                        make())
        assert torch.equal(tokens[i], alone[0]), f"row {i} ({len(row)} tokens)"
        assert (logits[:, i].double() - alone_logits[:, 0].double()).abs().max() <= LOGITS
        for layer, (b, a) in enumerate(zip(kept, alone_kept)):  # the same tokens kept, padding never among them
            real = b[i][b[i] >= 0].view(b.shape[1], -1)
            assert torch.equal(real.sort(-1).values, a[0].sort(-1).values), f"row {i}, layer {layer}"
            if make().budget is not None:  # an evicting cache is full of real tokens once the padding is gone
                assert bool((b[i] >= 0).all())
            if kw.get("sinks", 4 if name == "streaming" else 0):  # the row's own first tokens are its sinks
                assert set(range(kw.get("sinks", 4))) <= set(real[0].tolist())


@pytest.mark.slow
def test_a_padded_batch_of_real_prompts_on_smollm2(smollm2, smollm2_f64, austen_ids):
    _, hf = smollm2_f64
    rows = [austen_ids[0, 100:112], austen_ids[0, 300:326]]  # 12 and 26 tokens, through a cache of 16
    n = max(len(r) for r in rows)
    pad = smollm2[1].eos_token_id
    ids = torch.stack([torch.cat([torch.full((n - len(r),), pad), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(n - len(r), dtype=torch.long), torch.ones(len(r), dtype=torch.long)])
                        for r in rows])
    policy = lambda: make_policy("streaming", BUDGET, model=course_config(hf))  # noqa: E731
    with PolicyCache(hf, policy()) as cache:
        out = hf.generate(ids, attention_mask=mask, cache=cache, max_new_tokens=24, do_sample=False, pad_token_id=pad,
                          eos_token_id=None)
    for i, row in enumerate(rows):
        with PolicyCache(hf, policy()) as cache:
            alone = hf.generate(row[None], attention_mask=torch.ones(1, len(row), dtype=torch.long), cache=cache,
                                max_new_tokens=24, do_sample=False, pad_token_id=pad, eos_token_id=None)
        assert torch.equal(out[i, n:], alone[0, len(row):])


class Oracle:
    """A logits processor that checks every row's scores against the course's own decode of that row's tokens
    (its prompt without padding, then what it generated), with a fresh cache of the same policy, in float64."""

    def __init__(self, model, make, prompt_lengths: list[int], padded: int, per_prompt: int, log_probs: bool) -> None:
        self.model, self.make, self.lengths, self.padded = model, make, prompt_lengths, padded
        self.per_prompt, self.log_probs, self.checked, self.worst = per_prompt, log_probs, 0, 0.0

    def __call__(self, input_ids, scores):
        for r in range(input_ids.shape[0]):
            n = self.lengths[r // self.per_prompt]
            prompt = input_ids[r, self.padded - n : self.padded][None]
            cache, logits = compress_prompt(self.model, prompt, self.make())
            last = logits[0, -1]
            with torch.inference_mode():
                for t in input_ids[r, self.padded:]:
                    last = self.model(t.view(1, 1), cache=cache).logits[0, -1]
            want = torch.log_softmax(last, -1) if self.log_probs else last
            seen = torch.isfinite(scores[r])  # what generate's own processors (top-k ...) left
            self.worst = max(self.worst, float((scores[r][seen].double() - want[seen].double()).abs().max()))
            self.checked += 1
        return scores


@pytest.mark.slow
@pytest.mark.parametrize("name,kw,impl", [("streaming", {}, "sdpa"),
                                         ("h2o", {"sinks": 2, "positions": "cache"}, "eager")])
@pytest.mark.parametrize("mode", ["sampling", "beams"])
def test_sampling_beams_and_several_sequences_per_prompt(name, kw, impl, mode):
    hf = small_hf("llama", impl)
    model = from_transformers(hf)
    make = factory_of(name, kw, model)
    rows = prompts((6, 13))
    ids, mask = left_padded(rows)
    beams = 3 if mode == "beams" else 1
    per_prompt = 3 if mode == "sampling" else beams
    oracle = Oracle(model, make, [len(r) for r in rows], ids.shape[1], per_prompt, log_probs=mode == "beams")
    settings = dict(do_sample=True, num_return_sequences=3) if mode == "sampling" else \
        dict(do_sample=False, num_beams=beams, num_return_sequences=2)
    torch.manual_seed(6)
    with PolicyCache(hf, make()) as cache:
        out = hf.generate(ids, attention_mask=mask, cache=cache, max_new_tokens=2 * BUDGET, pad_token_id=PAD,
                          eos_token_id=None, logits_processor=LogitsProcessorList([oracle]), **settings)
        assert cache.n_slots == BUDGET
    print(f"{mode}, {make().label}: {oracle.checked} row-steps checked, max |score diff| {oracle.worst:.1e}")
    assert out.shape[0] == 2 * (3 if mode == "sampling" else 2)
    assert oracle.checked >= 2 * per_prompt * 2 * BUDGET
    assert oracle.worst <= LOGITS
    if mode == "sampling":
        assert len({tuple(r.tolist()) for r in out}) > 2  # sampling: the sequences of a prompt differ


# ----------------------------------------------------------------------------- refusals, in one line, before any work
def refused(hf, cache, match: str, *args, **kwargs):
    with pytest.raises(UnsupportedCombination, match=match) as e:
        hf.generate(*args, cache=cache, pad_token_id=PAD, **kwargs)
    assert "\n" not in str(e.value)
    return e


def test_right_padding_and_padding_inside_are_refused_by_name():
    hf = small_hf("llama")
    cache = PolicyCache(hf, make_policy("streaming", BUDGET, model=course_config(hf)))
    ids = torch.ones(2, 6, dtype=torch.long)
    right = torch.ones_like(ids)
    right[1, 4:] = 0
    refused(hf, cache, "right padding.*padding_side = 'left'", ids, attention_mask=right, max_new_tokens=2)
    inside = torch.ones_like(ids)
    inside[1, 2] = 0
    refused(hf, cache, "padding inside a prompt", ids, attention_mask=inside, max_new_tokens=2)
    assert cache.seen == 0


def test_decoding_that_undoes_steps_is_refused_before_any_work():
    hf = small_hf("llama")
    cache = PolicyCache(hf, make_policy("streaming", BUDGET, model=course_config(hf)))
    ids = torch.randint(0, PAD, (1, 8))
    refused(hf, cache, "does not support assisted generation", ids, max_new_tokens=4, prompt_lookup_num_tokens=2)
    refused(hf, cache, "does not support contrastive search", ids, max_new_tokens=4, penalty_alpha=0.6, top_k=4)
    assert cache.seen == 0
    with pytest.raises(UnsupportedCombination, match="cannot crop"):
        cache.crop(-1)


def tiny_gpt2(positions: int = 32):
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=101, n_positions=positions, n_embd=32, n_layer=2, n_head=2)).eval()


def test_gpt2_past_its_positions_is_refused_by_name_before_any_work():
    hf = tiny_gpt2(32)
    cache = PolicyCache(hf, make_policy("streaming", 8, model=course_config(hf)))  # original positions
    ids = torch.randint(0, PAD, (1, 10))
    e = refused(hf, cache, "needs 39 token positions but .* has 32 .*learned", ids, max_new_tokens=30)
    assert cache.seen == 0 and "IndexError" not in repr(e.value)
    out = hf.generate(ids, cache=cache, max_new_tokens=23, pad_token_id=PAD, eos_token_id=None)  # 10 + 23 - 1 = 32
    assert out.shape[1] == 33
    cache.reset()
    with pytest.raises(UnsupportedCombination, match="has 32"), torch.no_grad():
        hf(torch.randint(0, PAD, (1, 33)), cache=cache)  # a forward past the positions, without generate
    assert cache.seen == 0


def test_a_cache_holds_one_stream_continued_or_refused():
    hf = small_hf("llama")
    make = factory_of("streaming", {}, course_config(hf))
    ids = torch.randint(0, PAD, (1, 8), generator=torch.Generator().manual_seed(7))
    run = dict(pad_token_id=PAD, eos_token_id=None, do_sample=False)
    ones = torch.ones_like  # no padding anywhere (a generated token may equal PAD)
    with PolicyCache(hf, make()) as cache:
        whole = hf.generate(ids, attention_mask=ones(ids), cache=cache, max_new_tokens=2 * BUDGET, **run)
    cache = PolicyCache(hf, make())
    first = hf.generate(ids, attention_mask=ones(ids), cache=cache, max_new_tokens=BUDGET, **run)
    seen = cache.seen
    refused(hf, cache, f"already holds a stream of {seen} tokens.*not \\[1, {seen + 1}\\]", ids,
            attention_mask=ones(ids), max_new_tokens=4)  # the same prompt again
    unrelated = torch.randint(0, PAD, (1, seen + 1), generator=torch.Generator().manual_seed(8))
    refused(hf, cache, "do not begin with the stream so far", unrelated, attention_mask=ones(unrelated),
            max_new_tokens=4)  # an unrelated prompt of exactly seen + 1 tokens
    two = torch.cat([first, first[:, -2:]], 1)
    refused(hf, cache, "shape", two, attention_mask=ones(two), max_new_tokens=4)  # two new tokens at once
    assert cache.seen == seen
    again = hf.generate(first, attention_mask=ones(first), cache=cache, max_new_tokens=BUDGET, **run)  # continued
    assert torch.equal(again, whole)
    cache.reset()  # a new stream
    assert torch.equal(hf.generate(ids, attention_mask=ones(ids), cache=cache, max_new_tokens=2 * BUDGET, **run), whole)


# ----------------------------------------------------------------------------- lifetime: nothing left behind
def hooks_on(hf) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in hf.modules())


def tensor_bytes() -> int:
    """Bytes of every tensor storage alive (each storage once)."""
    gc.collect()
    storages = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            st = obj.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
    return sum(storages.values())


@pytest.mark.slow
def test_two_hundred_generate_calls_leave_nothing_behind():
    hf = small_hf("llama", "eager")
    ids = torch.randint(0, PAD, (2, 12))
    policy = make_policy("h2o", BUDGET, sinks=2, model=course_config(hf))  # hooks on every attention module too
    hooks, freed, memory = hooks_on(hf), [], []
    for i in range(200):
        if i % 2:  # a cache passed inline: nothing holds it once generate returns
            hf.generate(ids, cache=PolicyCache(hf, policy), max_new_tokens=BUDGET + 4, pad_token_id=PAD)
        else:  # with a block
            with PolicyCache(hf, policy) as cache:
                hf.generate(ids, cache=cache, max_new_tokens=BUDGET + 4, pad_token_id=PAD)
                freed.append(weakref.ref(cache))
            assert cache.kv is None  # the slots are freed when the block ends
            del cache
        assert hooks_on(hf) == hooks  # no hook left on the model
        if i in (9, 199):
            memory.append(tensor_bytes())
    assert all(ref() is None for ref in freed)  # no reference cycle keeps a cache: freed as soon as it is dropped
    assert "generate" not in vars(hf)  # the check in front of generate goes with the last cache
    print(f"tensor memory after 10 calls {memory[0]} bytes, after 200 {memory[1]} bytes")
    assert memory[1] <= memory[0]


def test_a_dropped_cache_frees_its_hooks_at_once():
    hf = small_hf("llama")
    hooks = hooks_on(hf)
    cache = PolicyCache(hf, make_policy("streaming", BUDGET, model=course_config(hf)))
    with torch.no_grad():
        hf(torch.ones(1, 5, dtype=torch.long), cache=cache)
    ref = weakref.ref(cache)
    assert hooks_on(hf) > hooks and "generate" in vars(hf)
    del cache
    assert ref() is None and hooks_on(hf) == hooks and "generate" not in vars(hf)


# ----------------------------------------------------------------------------- a quantized store
QUANTIZED = [("full", {}, "sdpa"), ("streaming", {}, "sdpa"), ("streaming", {"positions": "original"}, "sdpa"),
             ("h2o", {"sinks": 2}, "eager")]


def kivi_2bit():
    from course.quantize import KIVI

    return KIVI(bits=2, group=4, residual=4, exact_sinks=2)  # two exact, so StreamingLLM's sinks 2 and 3 move rounded


@pytest.mark.parametrize("name,kw,impl", QUANTIZED, ids=[f"{n}-{'-'.join(map(str, kw.values())) or 'default'}"
                                                         for n, kw, _ in QUANTIZED])
def test_a_quantized_store_in_policycache_is_the_course_models_with_rotated_keys(name, kw, impl):
    """transformers hands the cache rotated keys, so PolicyCache's store rounds them as they arrived (KIVI's own
    placement, and transformers' QuantizedCache's); the course's model does the same with ``new_cache(rotated=True)``.
    The two give the same greedy tokens and logits over four times the budget, and the store's bytes stay within
    ``KIVI.max_bytes``."""
    hf = small_hf("llama", impl).double()
    model = from_transformers(hf)
    make = lambda: make_policy(name, BUDGET, model=course_config(hf), quantizer=kivi_2bit(), **kw)  # noqa: E731
    ids = prompts([2 * BUDGET])[0][None]
    tokens, logits, _ = generate_rows(hf, ids, torch.ones_like(ids), make())
    cache, out = compress_prompt(model, ids, make(), cache=model.new_cache(1, make(), rotated=True))
    mine, step = [], out[0, -1]
    with torch.inference_mode():
        for i in range(tokens.shape[1]):
            assert (step - logits[i, 0]).abs().max() <= LOGITS, f"step {i}"
            mine.append(int(step.argmax()))
            step = model(torch.tensor([[mine[-1]]]), cache=cache).logits[0, -1]
    assert mine == tokens[0].tolist()
    c = model.config
    assert cache.bytes_at(2) <= kivi_2bit().max_bytes(cache.n_slots, c.n_layer, 1, c.n_kv_head, c.head_dim, 2)
    if name != "h2o":  # runs of neighbouring tokens: fewer bytes than the slots at 16 bits (H2O's scattered key
        assert cache.bytes_at(2) < cache.n_slots * c.cache_bytes_per_token(2)  # groups may cost more: test_quantize)


@pytest.mark.parametrize("name,kw,impl", QUANTIZED[1:], ids=[f"{n}-{'-'.join(map(str, kw.values())) or 'default'}"
                                                             for n, kw, _ in QUANTIZED[1:]])
def test_each_row_of_a_padded_batch_is_its_prompt_alone_on_a_quantized_store(name, kw, impl):
    """The store rounds each row at its own stream's positions (a left-padded row starts later), so every row of
    the batch is stored, and generates, as its prompt alone."""
    hf = small_hf("llama", impl).double()
    make = lambda: make_policy(name, BUDGET, model=course_config(hf), quantizer=kivi_2bit(), **kw)  # noqa: E731
    rows = prompts(LENGTHS)
    ids, mask = left_padded(rows)
    tokens, logits, _ = generate_rows(hf, ids, mask, make())
    for i, row in enumerate(rows):
        alone, alone_logits, _ = generate_rows(hf, row[None], torch.ones(1, len(row), dtype=torch.long), make())
        assert torch.equal(tokens[i], alone[0]), f"row {i} ({len(row)} tokens)"
        assert (logits[:, i] - alone_logits[:, 0]).abs().max() <= LOGITS
