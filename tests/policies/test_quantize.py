"""The quantized store (``course.quantize.KIVI``): the quantizer's arithmetic, KIVI's layout inside the real cache
under a running model (keys per channel over token groups, values per token over channel groups, the residual and the
sinks in full precision), the bytes a packed store holds, and the store under eviction policies."""

from __future__ import annotations

import pytest
import torch

from course.exercises.fixtures import tiny_model
from course.policies import POLICIES, make_policy, policy_names
from course.quantize import GROUP_STAT, KIVI, dequantize, fake_quantize, quantize
from course.streaming import decode_stream, exact_stream


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_quantize_round_trip_is_within_half_a_step(bits):
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(bits)) * 4
    codes, scale, zero = quantize(x, bits, dim=-1)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 2**bits - 1
    assert scale.shape == zero.shape == (3, 5, 1)
    back = dequantize(codes, scale, zero)
    assert (back - x).abs().max() <= scale.max() / 2 + 1e-5
    # the ends of every group come back exactly (asymmetric min-max)
    assert torch.allclose(back.amin(-1), x.amin(-1), atol=1e-5) and torch.allclose(back.amax(-1), x.amax(-1), atol=1e-4)
    assert torch.equal(fake_quantize(torch.full((4, 8), 2.5), bits, dim=-1), torch.full((4, 8), 2.5))


@pytest.mark.parametrize("change, message", [
    (dict(bits=3), "bits must be one of (2, 4, 8)"), (dict(group=0), "group must be an integer >= 1"),
    (dict(residual=-1), "residual must be"), (dict(exact_sinks=1.5), "exact_sinks must be")])
def test_bad_settings_are_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        KIVI(**change)


def _stream(model, policy, n: int = 40, seed: int = 0):
    """Decode n random tokens one by one through a cache made for ``policy``, keys cached before rotation (as a
    quantized store holds them): the cache."""
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))
    cache = model.new_cache(1, policy, rotated=False)
    with torch.inference_mode():
        for t in range(n):
            model(ids[:, t : t + 1], cache=cache)
    return cache


def test_kivi_layout_in_the_cache_of_a_running_model():
    """Layer 0's keys and values depend only on their own token (keys are cached before rotation), so a plain run
    gives the originals: every quantized group is exactly KIVI's rounding of them, the rest untouched."""
    model = tiny_model("llama")
    kivi = KIVI(bits=2, group=4, residual=6, exact_sinks=3)
    plain = _stream(model, make_policy("full")).layers[0]
    store = _stream(model, make_policy("full", quantizer=kivi)).layers[0]
    k0, v0, pos = plain.live()
    k, v, _ = store.live()
    n = pos.shape[-1]
    groups = (n - 1 - kivi.residual) // kivi.group  # quantized before the last token arrived
    assert groups == 8
    for g in range(groups):
        span = slice(g * kivi.group, (g + 1) * kivi.group)
        want_k = fake_quantize(k0[:, :, span], 2, dim=2)  # per channel, over tokens (the sinks in their group's scales)
        b, h, t, d = v0[:, :, span].shape
        want_v = fake_quantize(v0[:, :, span].reshape(b, h, t, d // 4, 4), 2, dim=-1).reshape(b, h, t, d)
        if g == 0:  # the sinks put back exactly
            want_k[:, :, :3], want_v[:, :, :3] = k0[:, :, :3], v0[:, :, :3]
        assert torch.allclose(k[:, :, span], want_k)
        assert torch.allclose(v[:, :, span], want_v)  # per token, over groups of 4 channels
        assert g == 0 or all(k[0, 0, span, c].unique().numel() <= 4 for c in range(d))
    rest = slice(groups * kivi.group, n)
    assert torch.equal(k[:, :, :3], k0[:, :, :3]) and torch.equal(v[:, :, :3], v0[:, :, :3])  # the sinks exact
    assert torch.equal(k[:, :, rest], k0[:, :, rest]) and torch.equal(v[:, :, rest], v0[:, :, rest])
    assert (store.stat(GROUP_STAT) > 0).sum() == (groups * kivi.group - kivi.exact_sinks) * k.shape[1]


def _packed_bytes(n_tokens: int, quantized: int, groups: int, d: int, bits: int, group: int, heads: int,
                  full_bytes: int) -> int:
    """A packed store, counted by hand for one layer and one batch row."""
    codes = quantized * 2 * d * bits / 8
    value_scales = quantized * (d // group) * 2 * 2
    key_scales = groups * d * 2 * 2
    return int(heads * (codes + value_scales + key_scales + (n_tokens - quantized) * 2 * d * full_bytes))


def test_bytes_count_codes_scales_and_full_precision_tokens():
    model = tiny_model("llama")
    kivi = KIVI(bits=4, group=4, residual=6, exact_sinks=3)
    cache = _stream(model, make_policy("full", quantizer=kivi))
    per_layer = _packed_bytes(40, 8 * 4 - 3, 8, 8, 4, 4, 2, 8)  # float64 model: 8 bytes per number; 3 sinks exact
    assert cache.nbytes == model.config.n_layer * per_layer
    plain = _stream(model, make_policy("full"))
    assert cache.nbytes < plain.nbytes
    # the long-run cost per token: 2 L H_kv (d b/8 + 2 s d/G)
    assert kivi.bytes_per_token(2, 2, 8) == 2 * 2 * 2 * (8 * 4 / 8 + 2 * 2 * 8 / 4)


def test_eviction_runs_on_the_quantized_store():
    model = tiny_model("llama")
    kivi = KIVI(bits=4, group=4, residual=4, exact_sinks=4)
    cache = _stream(model, make_policy("streaming", 16, model=model, quantizer=kivi), n=60)
    assert cache.n_slots == 16
    pos = cache.positions(0)[0, 0].sort().values
    assert pos.tolist() == [0, 1, 2, 3, *range(48, 60)]
    groups = cache.layers[0].stat(GROUP_STAT)
    assert bool((groups[cache.positions(0) < 4] == 0).all())  # the sinks were never quantized
    h2o = _stream(model, make_policy("h2o", 16, quantizer=KIVI(bits=2, group=4, residual=4)), n=60)
    assert h2o.n_slots == 16 and bool((h2o.layers[0].stat(GROUP_STAT) > 0).any())
    assert repr(h2o.policy) == "h2o(8+8)@2-bit"


def test_fewer_bits_cost_more_loss():
    """On one stream of a small random model: the NLL's distance from the full-precision cache's grows as the bits
    shrink."""
    model = tiny_model("llama", n_layer=2)
    ids = torch.randint(0, 53, (1, 64), generator=torch.Generator().manual_seed(3))
    base = decode_stream(model, ids, make_policy("full"), progress=False).nll

    def gap(**settings) -> float:
        policy = make_policy("full", quantizer=KIVI(group=8, residual=8, **settings))
        return float((decode_stream(model, ids, policy, progress=False).nll - base).abs().mean())

    gaps = [gap(bits=b) for b in (8, 4, 2)]
    assert 0 < gaps[0] < gaps[1] < gaps[2]


@pytest.mark.parametrize("name, budget, kivi", [
    ("full", None, KIVI(bits=2, group=4, residual=6)),
    ("window", 20, KIVI(bits=4, group=4, residual=4, exact_sinks=2)),
    ("streaming", 24, KIVI(bits=2, group=8, residual=0, exact_sinks=4)),
    ("streaming", 24, KIVI(bits=8, group=4, residual=5, keys="token"))])
def test_the_exact_evaluator_equals_the_decode_loop_on_a_quantized_store(name, budget, kivi):
    model = tiny_model("llama")
    ids = torch.randint(0, 53, (2, 70), generator=torch.Generator().manual_seed(5))
    policy = lambda: make_policy(name, budget, model=model, quantizer=kivi)  # noqa: E731
    slow = decode_stream(model, ids, policy(), progress=False)
    fast = exact_stream(model, ids, policy(), chunk=16, progress=False)
    assert torch.allclose(fast.nll, slow.nll, atol=1e-9)
    assert fast.cache_bytes[-1] == slow.cache_bytes[-1]
    plain = decode_stream(model, ids, make_policy(name, budget, model=model), progress=False)
    assert not torch.allclose(plain.nll, slow.nll, atol=1e-6)  # the store changed something


def test_a_chunk_a_key_group_leaves_the_residual_within_is_refused():
    model = tiny_model("llama")
    kivi = KIVI(bits=4, group=4, residual=4)
    assert kivi.chunk_starts(20) == [8, 12, 16]
    cache = model.new_cache(1, make_policy("window", 30, quantizer=kivi), chunks="stream")
    with torch.inference_mode():
        model(torch.zeros(1, 8, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="may not cross position 12"):
            model(torch.zeros(1, 6, dtype=torch.long), cache=cache)


def test_a_bad_group_is_refused_by_the_cache():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="group must divide the head dimension 8"):
        model.new_cache(1, make_policy("full", quantizer=KIVI(group=3)))


def test_a_quantized_store_rounds_keys_before_rotation_or_as_they_arrived_rotated():
    """The course's model caches unrotated keys for a quantized policy by default (rounded before the rotary
    embedding, as KVQuant); ``rotated=True`` rounds them rotated, as they arrive in transformers (KIVI's placement):
    there a key the policy moves (StreamingLLM's sinks past the exact ones) is placed again from its rounded self."""
    from course.rope import rope

    model = tiny_model("llama")
    policy = lambda: make_policy("streaming", 16, model=model, quantizer=KIVI(bits=2, group=4, residual=4,  # noqa: E731
                                                                           exact_sinks=2))
    assert model.new_cache(1, policy()).rope_theta is None
    ids = torch.randint(0, 53, (1, 40), generator=torch.Generator().manual_seed(4))
    caches = [model.new_cache(1, policy()), model.new_cache(1, policy(), rotated=True)]
    with torch.inference_mode():
        logits = [torch.cat([model(ids[:, t : t + 1], cache=c).logits for t in range(40)], 1) for c in caches]
    layer = caches[1].layers[0]
    keys, _, pos = layer.live()
    moved = (layer.offsets[:, :, : layer.length] != 0) & (layer.stat(GROUP_STAT) > 0)  # rounded sinks, moved
    assert bool(moved.any()) and set(pos[moved].tolist()) == {2, 3}
    arrived = layer.originals[:, :, : layer.length]
    again = rope(arrived[None], layer.offsets[:, :, : layer.length][None], model.config.rope_theta)[0]
    assert torch.allclose(keys[moved], again[moved], atol=1e-12)  # placed from the rounded key as it arrived
    assert bool((arrived[:, :, 2:4] != rope(caches[0].layers[0].live()[0][:, :, 2:4], pos[:, :, 2:4],
                                           model.config.rope_theta)).any())  # a different rounding than before RoPE
    assert not torch.allclose(logits[0], logits[1], atol=1e-6)


def test_one_prompt_forward_serves_quantized_and_plain_caches():
    """A comparison that mixes stores (notebook 08's passkey) runs the prompt once for all: each cache then decodes
    as it would alone."""
    from course.compression import compress_prompt, compress_prompts

    model = tiny_model("llama")
    prompt = torch.randint(0, 53, (1, 30), generator=torch.Generator().manual_seed(2))
    quantized = lambda: make_policy("full", quantizer=KIVI(bits=2, group=4, residual=4))  # noqa: E731
    caches, _ = compress_prompts(model, prompt, [make_policy("streaming", 12, model=model), quantized()])
    alone, _ = compress_prompt(model, prompt, quantized())
    nxt = torch.tensor([[5]])
    with torch.inference_mode():
        together, by_itself = model(nxt, cache=caches[1]).logits, model(nxt, cache=alone).logits
    assert torch.allclose(together, by_itself, atol=1e-12)
    assert caches[0].n_slots == 12 and caches[1].n_slots == 31


def test_a_rounding_function_gives_its_work_back_and_is_held_to_its_contract():
    """The build's store (RoundingFunction) takes what the function returns, never what it changed in place (under
    the grader the function runs in another process), and names a malformed return."""
    from course.quantize import RoundingFunction

    model = tiny_model("llama")
    kivi = dict(bits=2, group=4, residual=6)

    def rounds_in_place(keys, values, positions, done, next_position, bits, group, residual):
        KIVI(bits=bits, group=group, residual=residual).round_groups(keys, values, positions, done, next_position)
        return done  # the work is lost: only the returned value counts

    def course(keys, values, positions, done, next_position, bits, group, residual):
        settled = KIVI(bits=bits, group=group, residual=residual).round_groups(keys, values, positions, done,
                                                                               next_position)
        return keys, values, settled

    with pytest.raises(ValueError, match=r"must return \(keys, values, done\)"):
        _stream(model, make_policy("full", quantizer=RoundingFunction(fn=rounds_in_place, **kivi)))
    ours = _stream(model, make_policy("full", quantizer=RoundingFunction(fn=course, **kivi))).layers[0].live()
    theirs = _stream(model, make_policy("full", quantizer=KIVI(**kivi))).layers[0].live()
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_sinks_exact_changes_only_the_first_slots():
    """``exact_sinks=N`` stores tokens 0..N-1 exactly and nothing else changes: the same groups, scales and slots as
    the store without the option, in every layer (where later layers' inputs differ, compare layer 0, whose keys
    and values depend on their own token only), and the same bytes but for the N tokens' codes."""
    model = tiny_model("llama")
    plain = _stream(model, make_policy("full")).layers[0].live()
    without = _stream(model, make_policy("full", quantizer=KIVI(bits=2, group=4, residual=6))).layers[0]
    sinks = KIVI(bits=2, group=4, residual=6, exact_sinks=3)
    with_sinks = _stream(model, make_policy("full", quantizer=sinks)).layers[0]
    for a, b, exact in zip(without.live(), with_sinks.live(), plain):
        assert torch.equal(a[:, :, 3:], b[:, :, 3:])                        # every later slot as without the option
        assert torch.equal(b[:, :, :3], exact[:, :, :3])                    # the first three exact
    assert not torch.equal(without.live()[0][:, :, :3], plain[0][:, :, :3])  # which the 2-bit store had rounded
    ids_without, ids_with = without.stat(GROUP_STAT), with_sinks.stat(GROUP_STAT)
    assert torch.equal(ids_without[..., 3:], ids_with[..., 3:]) and bool((ids_with[..., :3] == 0).all())


def _slots_at_most(name: str, budget: int | None, fed: int, prompt: int) -> int:
    """The most slots per KV head a policy may hold after ``fed`` tokens: its budget once full, where it evicts
    while decoding; a prompt compressed once (SnapKV) grows by every token decoded after it; the full cache keeps
    all."""
    if budget is None:
        return fed
    if POLICIES[name].prefill_only:
        return min(prompt, budget) + fed - prompt
    return min(fed, budget)


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("name", policy_names())
def test_every_policy_streams_and_generates_on_a_quantized_store_within_its_bytes(name, bits):
    """Every policy of the table with a 4-bit and a 2-bit store (two sinks exact), on a batch of two: a stream and a
    generation run with finite logits, and the store's bytes after every token stay within ``KIVI.max_bytes`` of the
    slots the policy may hold. Below those slots in full precision too, for the policies that keep runs of
    neighbouring tokens; one that scatters its slots (H2O, SnapKV, random) can leave a key group with a single token,
    whose per-channel scales (2 d numbers) then cost more than the token itself in full precision."""
    from course.generate import sample_batch

    model = tiny_model("llama")
    kivi = KIVI(bits=bits, group=4, residual=4, exact_sinks=2)
    budget = None if name == "full" else 16
    policy = lambda: make_policy(name, budget, model=model, quantizer=kivi)  # noqa: E731
    shape = dict(n_layers=model.config.n_layer, batch=2, kv_heads=model.config.n_kv_head,
                 head_dim=model.config.head_dim, dtype_bytes=2)
    full_slot = model.config.cache_bytes_per_token(2) * 2  # a slot of every layer, both rows, at 16 bits
    ids = torch.randint(0, 53, (2, 48), generator=torch.Generator().manual_seed(9))
    cache = model.new_cache(2, policy())
    with torch.inference_mode():
        for t in range(ids.shape[1]):
            logits = model(ids[:, t : t + 1], cache=cache).logits
            assert bool(torch.isfinite(logits).all()), (name, t)
            slots = _slots_at_most(name, budget, t + 1, 0)
            assert cache.n_slots <= slots and cache.bytes_at(2) <= kivi.max_bytes(slots, **shape), (name, t)
    runs = name in ("full", "window", "streaming")
    assert not runs or cache.bytes_at(2) < cache.n_slots * full_slot  # groups rounded: fewer bytes than the slots
    new, cache = sample_batch(model, ids[:, :24], policy(), max_new_tokens=12)
    assert new.shape == (2, 12) and bool(((new >= 0) & (new < model.config.vocab_size)).all())
    slots = _slots_at_most(name, budget, 24 + 11, 24)
    assert cache.n_slots <= slots and cache.bytes_at(2) <= kivi.max_bytes(slots, **shape)
    assert not runs or cache.bytes_at(2) < cache.n_slots * full_slot
