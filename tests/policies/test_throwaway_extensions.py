"""A new policy is one class and one ``register``; a new store is one class and one ``register_storage``: a policy
and a store made up here, registered for this test only, run through every generic consumer (the course's cache,
transformers' ``PolicyCache``, the timing of the benchmark, the cache explorer) without a line of them naming it."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from course.exercises.fixtures import tiny_model
from course.policies import POLICIES, Policy, PolicyKind, make_policy, pinned, policy_names, register
from course.slots import LayerCache
from course.storage import STORAGES, Storage, make_storage, register_storage
from course.timing import bench_policies
from course.widgets import cache_explorer, cache_view, explorer_policy, sinks_range

BUDGET = 12


class KeepOldest(Policy):
    """Keep the oldest tokens (evict the newest cached one), unless its per-slot ``oldest_bonus`` says otherwise."""

    name = "keep-oldest"
    eviction_stats = ("oldest_bonus",)

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def scores(self, layer: LayerCache, seen) -> Tensor:
        return layer.stat("oldest_bonus") - layer.positions[:, :, : layer.length].float()


class HalfValues(Storage):
    """Values older than ``AGE`` positions rounded to bfloat16; keys untouched."""

    name = "half-values"
    rounds = True
    slot_stat = "half_values"
    AGE = 4

    def settle(self, keys, values, positions, stat, done, next_position, *, rotated=False) -> int:
        old = (positions >= 0) & (positions < next_position - self.AGE)
        values.copy_(torch.where(old[..., None], values.to(torch.bfloat16).to(values.dtype), values))
        stat.copy_(old.to(stat.dtype))
        return max(done, next_position - self.AGE)

    def nbytes(self, layer: LayerCache, dtype_bytes: int) -> int:
        b, h, s, d = layer.live()[0].shape
        rounded = int(layer.stat(self.slot_stat).sum())
        return 2 * b * h * s * d * dtype_bytes - rounded * d * (dtype_bytes - 2)


@pytest.fixture
def registered():
    """The throwaway policy and store in their tables for one test, then gone."""
    register(PolicyKind("keep-oldest", lambda budget, sinks, rule, **o: pinned(KeepOldest(budget), sinks)))
    register_storage(HalfValues)
    try:
        yield
    finally:
        del POLICIES["keep-oldest"], STORAGES["half-values"]


def _values_are_rounded(layer: LayerCache, newest: int) -> bool:
    _, v, pos = layer.live()
    old = pos < newest - HalfValues.AGE
    return bool(old.any()) and torch.equal(v[old], v[old].to(torch.bfloat16).to(v.dtype))


def test_the_tables_list_them(registered):
    assert "keep-oldest" in policy_names() and "keep-oldest" in policy_names("bench")
    assert isinstance(make_storage("half-values"), HalfValues)
    assert sinks_range("keep-oldest") == (0, sinks_range("h2o")[1])  # the explorer asks the row, not the name
    assert explorer_policy("keep-oldest", BUDGET, 2).label == "keep-oldest+2 sinks"


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_course_cache_decodes_with_them(registered, family):
    model = tiny_model(family)
    ids = torch.randint(0, model.config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(1))
    plain = model.new_cache(1, make_policy("keep-oldest", BUDGET))
    stored = model.new_cache(1, make_policy("keep-oldest", BUDGET, quantizer=make_storage("half-values")))
    with torch.inference_mode():
        for t in range(ids.shape[1]):
            model(ids[:, t : t + 1], cache=plain)
            model(ids[:, t : t + 1], cache=stored)
    kept = plain.positions(0).sort(-1).values
    assert torch.equal(kept[0, 0], torch.cat([torch.arange(BUDGET - 1), torch.tensor([29])]))  # oldest + the newest
    assert stored.n_slots == BUDGET and all(_values_are_rounded(layer, 29) for layer in stored.layers)
    assert stored.nbytes < plain.nbytes
    assert repr(stored.policy) == "keep-oldest@half-values"


def test_transformers_policy_cache_generates_with_them(registered):
    from tests.models.test_transformers_cache import small_hf

    from course.transformers_cache import PolicyCache, course_config

    hf = small_hf("llama")
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(2))
    policy = make_policy("keep-oldest", BUDGET, model=course_config(hf), quantizer=make_storage("half-values"))
    with PolicyCache(hf, policy) as cache:
        out = hf.generate(ids, cache=cache, max_new_tokens=20, do_sample=False, pad_token_id=0)
        assert out.shape[1] == 28 and cache.n_slots == BUDGET
        assert all(_values_are_rounded(layer, cache.seen - 1) for layer in cache.kv.layers)


def test_the_benchmark_times_them(registered):
    """``bench_policies`` (what ``python -m course bench`` runs for its policy table) lists the registered policies
    shown in ``bench``, fills each one's eviction statistics and times it, in any store."""
    model = tiny_model("llama").float()
    ids = torch.zeros(1, 4, dtype=torch.long)
    for storage in (None, make_storage("half-values")):
        out = bench_policies(model, ids, [16, 32], budget=BUDGET, steps=1, reps=1, storage=storage)
        row = out["per_policy"]["keep-oldest"]
        assert row["tokens"] == [16, 32] and all(ms > 0 for ms in row["ms_per_token"])
        assert row["cache_bytes"][0] == out["per_policy"]["streaming"]["cache_bytes"][0]  # both hold the budget


class _Tokens:
    def decode(self, ids) -> str:
        return f"<{ids[0]}>"


def test_the_cache_explorer_shows_them(registered):
    model = tiny_model("llama")
    ids = torch.randint(0, model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(3))
    view = cache_view(model, _Tokens(), ids, "keep-oldest", BUDGET, 0)
    assert view.kept == frozenset(range(BUDGET - 1)) | {38}  # the oldest, and the last token decoded
    view.figure()
    box = cache_explorer(model, _Tokens(), ids, policies=["keep-oldest", "window"])
    assert box.children
