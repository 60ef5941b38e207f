"""The stores behind the ``Storage`` protocol (``course.storage``): the table, and KIVI with keys rounded after the
rotary embedding (``KIVIPostRoPE``) against KIVI before it and against a direct reference."""

from __future__ import annotations

import pytest
import torch

from course.exercises.fixtures import tiny_model
from course.policies import make_policy
from course.rope import rope
from course.storage import (
    KIVI,
    STORAGES,
    FullPrecision,
    KIVIPostRoPE,
    Storage,
    make_storage,
    register_storage,
    storage_names,
)
from course.storage.rounding import fake_quantize

SETTINGS = dict(bits=2, group=4, residual=6)


def _stream(model, storage, n: int = 40, rotated: bool = False):
    """The cache after decoding n random tokens one by one, its tokens kept in ``storage``, and every step's
    logits [n, vocab]."""
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache(1, make_policy("full", quantizer=storage), rotated=rotated)
    with torch.inference_mode():
        logits = torch.cat([model(ids[:, t : t + 1], cache=cache).logits[0] for t in range(n)])
    return cache, logits


def test_the_table_of_stores():
    assert storage_names()[:3] == ("full", "kivi", "kivi-post-rope")
    assert isinstance(make_storage("full"), FullPrecision) and make_storage("kivi", bits=4) == KIVI(bits=4)
    with pytest.raises(ValueError, match="storage must be one of full, kivi, kivi-post-rope"):
        make_storage("fp8")
    with pytest.raises(ValueError, match="a store needs a name not registered yet"):
        register_storage(KIVI)
    assert STORAGES["kivi"] is KIVI
    with pytest.raises(ValueError, match="rope_theta must be positive"):
        KIVIPostRoPE(rope_theta=0.0)


def test_full_precision_is_the_protocol_default():
    model = tiny_model("llama")
    stored, logits = _stream(model, FullPrecision())
    plain, plain_logits = _stream(model, None)
    assert torch.equal(logits, plain_logits) and stored.nbytes == plain.nbytes
    assert stored.nbytes == Storage().nbytes(stored.layers[0], 8) * len(stored.layers)


def test_post_rope_rounds_the_rotated_keys():
    """Layer 0's keys depend only on their own token, so a full-precision run gives the keys as they arrived: every
    quantized key group of the post-RoPE store, rotated at its positions, is KIVI's per-channel rounding of the
    arrived keys rotated there (to float64 round-off), and differs from the store that rounds before RoPE."""
    model = tiny_model("llama")
    theta = model.config.rope_theta
    post, post_logits = _stream(model, KIVIPostRoPE(rope_theta=theta, **SETTINGS))
    pre, pre_logits = _stream(model, KIVI(**SETTINGS))
    plain = _stream(model, None)[0].layers[0]
    k0, v0, pos = plain.live()  # [1, H_kv, n, d] before rotation
    rotated = rope(k0, pos, theta)
    k_post, v_post, _ = post.layers[0].live()
    k_pre, v_pre, _ = pre.layers[0].live()
    n, g = pos.shape[-1], SETTINGS["group"]
    groups = (n - 1 - SETTINGS["residual"]) // g
    assert groups == 8
    for i in range(groups):
        part = slice(i * g, (i + 1) * g)
        want = fake_quantize(rotated[:, :, part], SETTINGS["bits"], dim=2)
        got = rope(k_post[:, :, part], pos[:, :, part], theta)
        assert torch.allclose(got, want, atol=1e-12, rtol=0)
        before_rope = rope(k_pre[:, :, part], pos[:, :, part], theta)  # rounded before rotation: another rounding
        assert (before_rope - want).abs().max() > 1e-3 * want.abs().max()
        assert torch.equal(v_post[:, :, part], v_pre[:, :, part])  # values: per token, as KIVI's
    rest = slice(groups * g, n)
    assert torch.equal(k_post[:, :, rest], k0[:, :, rest])  # the residual and the open group: untouched
    assert (post_logits - pre_logits).abs().max() > 1e-3
    assert post.nbytes == pre.nbytes  # the same bytes: only where the rounding happens differs


def test_post_rope_is_kivi_where_keys_arrive_rotated_or_never_rotate():
    llama = tiny_model("llama")
    post = _stream(llama, KIVIPostRoPE(rope_theta=llama.config.rope_theta, **SETTINGS), rotated=True)[1]
    assert torch.equal(post, _stream(llama, KIVI(**SETTINGS), rotated=True)[1])
    gpt2 = tiny_model("gpt2")
    assert torch.equal(_stream(gpt2, KIVIPostRoPE(rope_theta=None, **SETTINGS))[1], _stream(gpt2, KIVI(**SETTINGS))[1])
