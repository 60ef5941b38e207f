"""Several caches decoding side by side (``course.kvcache.CacheStack``): every contender of a comparison decoded in
one forward per token gives what it gives decoded alone (float64: to 1e-10), keeps the same slots (the policies that
read attention weights get their own rows' weights), and the stack refuses what it cannot run."""

from __future__ import annotations

import pytest
import torch

from course.compression import compress_prompts
from course.evaluate import compare_after_compression
from course.headwise import ada_kv
from course.kvcache import CacheStack
from course.policies import make_policy
from course.quantize import KIVI

from ..conftest import tiny_model

PROMPT, CONTINUATION, BUDGET = 30, 12, 10


def _contenders(model, batch: int) -> dict:
    """Fresh policies of every kind: none, position-decided with and without sinks, weight-reading (H2O while
    decoding, SnapKV at the prompt), a quantized store, and (Llama, one prompt at a time) per-head budgets."""
    c = model.config
    contenders = {"full": lambda: None, "window": lambda: make_policy("window", BUDGET, model=c),
                  "streaming": lambda: make_policy("streaming", BUDGET, model=c),
                  "h2o": lambda: make_policy("h2o", BUDGET, model=c),
                  "snapkv": lambda: make_policy("snapkv", BUDGET, model=c, obs_window=4)}
    if c.family == "llama":
        contenders["kivi"] = lambda: make_policy("full", quantizer=KIVI(bits=2, group=4, residual=4))
    if c.family == "llama" and batch == 1:
        contenders["ada-kv"] = lambda: ada_kv(c, BUDGET, obs_window=4)
    return contenders


def _alone(model, prompt, continuation, policy):
    """The contender decoded in a forward of its own, one token at a time: log-probabilities [B, N] and its cache."""
    (cache,), _ = compress_prompts(model, prompt[:, :-1], [policy], logits_to_keep=1)
    feed = torch.cat([prompt[:, -1:], continuation[:, :-1]], dim=1)
    with torch.inference_mode():
        logps = [torch.log_softmax(model(feed[:, i : i + 1], cache=cache).logits[:, -1].float(), -1)
                 .gather(-1, continuation[:, i : i + 1])[:, 0] for i in range(feed.shape[1])]
    return torch.stack(logps, 1), cache


def _kept(cache) -> list[torch.Tensor]:
    """Per layer, the original positions of the slots the cache holds, sorted per KV head."""
    return [layer.live()[2].sort(dim=-1).values for layer in cache.layers]


@pytest.mark.parametrize("family,batch", [("llama", 1), ("llama", 2), ("gpt2", 2)])
def test_contenders_decoded_side_by_side_give_what_each_gives_alone(family, batch):
    model = tiny_model(family)
    ids = torch.randint(0, 97, (batch, PROMPT + CONTINUATION), generator=torch.Generator().manual_seed(3))
    prompt, continuation = ids[:, :PROMPT], ids[:, PROMPT:]
    contenders = _contenders(model, batch)
    caches = []  # each contender's cache, in order, as it decoded in the stack

    def remember(cache) -> dict:
        caches.append(cache)
        return {}

    together = compare_after_compression(model, prompt, continuation, {n: f() for n, f in contenders.items()},
                                         inspect_first=remember)
    assert len(caches) == len(contenders)
    for (name, make), cache in zip(contenders.items(), caches):
        logps, alone = _alone(model, prompt, continuation, make())
        assert torch.allclose(together[name][0], logps, atol=1e-10, rtol=0), name
        assert together[name][1].shape == (batch, CONTINUATION)
        # the same slots at the end: eviction (H2O's from the weights it observed) chose alike
        assert all(torch.equal(a, b) for a, b in zip(_kept(cache), _kept(alone))), name
    assert all(bool(p.isfinite().all()) for p, _, _ in together.values())


def test_each_row_attends_to_its_own_cache_only():
    """Two members whose caches differ (a full cache and a two-slot window): were a row to see the other member's
    slots, its log-probabilities would move; stacked in either order, each gives its own."""
    model = tiny_model("llama")
    ids = torch.randint(0, 97, (1, PROMPT + CONTINUATION), generator=torch.Generator().manual_seed(4))
    prompt, continuation = ids[:, :PROMPT], ids[:, PROMPT:]
    full, _ = _alone(model, prompt, continuation, None)
    window, _ = _alone(model, prompt, continuation, make_policy("window", 2, model=model.config))
    assert not torch.allclose(full, window, atol=1e-3)
    for order in (["full", "window"], ["window", "full"]):
        made = {"full": None, "window": make_policy("window", 2, model=model.config)}
        out = compare_after_compression(model, prompt, continuation, {n: made[n] for n in order})
        assert torch.allclose(out["full"][0], full, atol=1e-10, rtol=0)
        assert torch.allclose(out["window"][0], window, atol=1e-10, rtol=0)


def test_a_stack_refuses_what_it_cannot_decode():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="at least one"):
        CacheStack([])
    ahead = model.new_cache(1)
    with torch.inference_mode():
        model(torch.tensor([[1, 2, 3]]), cache=ahead)
    with pytest.raises(ValueError, match="stream position"):
        CacheStack([model.new_cache(1), ahead])
    with pytest.raises(ValueError, match="stream position"):
        CacheStack([model.new_cache(1), tiny_model("llama", n_layer=3).new_cache(1)])
    padded = model.new_cache(1)
    padded.start = torch.tensor([0])
    with pytest.raises(ValueError, match="unpadded"):
        CacheStack([padded])
    stack = CacheStack([model.new_cache(1), model.new_cache(2)])
    assert stack.shape == (2, 3, 2, 8) and stack.seen == 0
    k = torch.zeros(3, 2, 1, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="mask=False"):
        stack.update(0, k, k, torch.zeros(3, 1, dtype=torch.long), mask=False)
    # a chunk of the exact evaluator carries a sink rotation: the stack decodes only
    streams = CacheStack([model.new_cache(1, make_policy("streaming", 6, model=model.config), chunks="stream",
                                          rotated=False)] * 2)
    with pytest.raises(ValueError, match="decodes only"), torch.inference_mode():
        model(torch.randint(0, 97, (2, 12)), cache=streams)
