"""A policy is declared once, as a row of the table of policies: a toy policy registered there, and nowhere
else, is offered by ``generate --policy``, ``stream``, the benchmark and the cache explorer.

docs/add-a-policy.md is this test's steps."""

from __future__ import annotations

import json

import ipywidgets as widgets
import pytest
import torch

from course.__main__ import main
from course.policies import POLICIES, PinSinks, Policy, PolicyKind, make_policy, pinned, policy_names, register
from course.timing import bench_policies
from course.widgets import cache_explorer

from tests.conftest import tiny_model
from tests.notebooks.test_widgets import WordTokenizer, control, find


# step 1: the policy, a subclass of Policy that scores the cached slots (higher: kept longer)
class KeepEveryOther(Policy):
    """A toy: evicts odd positions before even ones, the oldest first within each."""

    name = "every-other"

    def __init__(self, budget: int, positions: str = "original") -> None:
        self.budget = budget
        self.position_rule = positions

    def scores(self, layer, seen: int) -> torch.Tensor:
        positions = layer.positions[:, :, : layer.length].float()
        return positions + seen * (positions % 2 == 0)

    @property
    def label(self) -> str:
        return f"every-other({self.budget})"


@pytest.fixture
def every_other():
    # step 2: its row in the table: a name and how to build it (budget, sinks, position rule, options)
    kind = register(PolicyKind("every-other",
                               lambda budget, sinks, rule, **options: pinned(KeepEveryOther(budget, rule), sinks)))
    yield kind
    del POLICIES[kind.name]  # the table as it was for the other tests


def test_make_policy_builds_it_with_sinks_and_the_models_position_rule(every_other):
    policy = make_policy("every-other", 16, sinks=2, model=tiny_model("llama"))
    assert isinstance(policy, PinSinks) and isinstance(policy.inner, KeepEveryOther)
    assert policy.budget == 16 and policy.position_rule == "original"
    assert "every-other" in policy_names() and "every-other" in policy_names(streams=True)
    with pytest.raises(ValueError, match="registered already"):
        register(every_other)


def run_json(capsys, *argv) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_generate_and_stream_offer_it(every_other, capsys):
    out = run_json(capsys, "generate", "--model", "smollm2-135m", "--policy", "every-other", "--budget", "12",
                   "--prompt", "The first token of a stream draws attention from every later token, so a cache keeps",
                   "--max-new-tokens", "4", "--ignore-eos")
    assert out["policy"] == "every-other(12)" and out["new_tokens"] == 4 and out["max_cache_slots"] == 12
    out = run_json(capsys, "stream", "--model", "smollm2-135m", "--policy", "every-other", "--budget", "24",
                   "--tokens", "64")
    assert out["label"] == "every-other(24)" and out["tokens"] == 64 and out["ppl"] > 1


def test_the_benchmark_measures_it(every_other):
    model = tiny_model("llama", dtype=torch.float32)
    r = bench_policies(model, torch.randint(0, 97, (1, 8)), [20, 40], budget=16, steps=1, reps=1)
    slot = 2 * model.config.n_layer * model.config.n_kv_head * model.config.head_dim * 4
    assert r["per_policy"]["every-other"]["cache_bytes"] == [16 * slot, 16 * slot]


def test_the_cache_explorer_offers_it(every_other):
    torch.manual_seed(0)
    box = cache_explorer(tiny_model("llama"), WordTokenizer(), torch.randint(1, 97, (1, 40)))
    policy = control(box, "policy")
    assert "every-other" in policy.options
    policy.value = "every-other"
    status = find(box, widgets.HTML)[0]
    assert "every-other(38)" in status.value
