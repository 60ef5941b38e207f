"""Tiny-model pretraining: the task, the loss masking, cached runs, the variants and the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from course.__main__ import main
from course.model_names import SEED_MAX
from course.train import (
    MIN_SEEDS,
    BigramBackcopy,
    TrainConfig,
    attention_on_sink,
    lm_loss,
    over_seeds,
    prepend_sink,
    seed_list,
    train,
    train_seeds,
    variant_config,
    window_losses,
)


def test_bigram_backcopy_copies_after_triggers():
    task = BigramBackcopy(seed=3)
    x = task.sample(32, 50, torch.Generator().manual_seed(0))
    assert x.shape == (32, 50) and int(x.max()) < task.vocab
    copy = task.copy_targets(x)
    assert copy.any()
    b, t = copy.nonzero(as_tuple=True)
    assert torch.equal(x[b, t], x[b, t - 2])  # the token after a trigger repeats the one before it
    assert not task.is_trigger[x[:, 0]].any()
    again = task.sample(32, 50, torch.Generator().manual_seed(0))
    assert torch.equal(x, again)


def test_sink_is_prepended_and_never_a_target():
    x = torch.tensor([[3, 4, 5]])
    inputs = prepend_sink(x, 9)
    assert inputs.tolist() == [[9, 3, 4, 5]]
    logits = torch.zeros(1, 4, 10)
    logits[0, 0, 3] = logits[0, 1, 4] = logits[0, 2, 5] = 50.0  # predicts every content token
    logits[0, 3, 9] = 50.0  # would predict the sink after the last token: never scored
    assert lm_loss(logits, inputs, n_prefix=1).item() < 1e-6
    assert lm_loss(logits, inputs, n_prefix=0).item() < 1e-6


def test_training_learns_and_runs_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    cfg = variant_config("sink-token", steps=40, log_every=10)
    run = train(cfg, progress=False)
    assert run.log[0]["loss"] > run.log[-1]["loss"] and run.log[0]["loss"] == pytest.approx(math.log(65), abs=0.3)
    assert (run.path / "model.pt").is_file() and json.loads((run.path / "log.json").read_text())["log"] == run.log
    again = train(cfg, progress=False)
    assert again.loaded and all(torch.equal(a, b) for a, b in zip(run.model.state_dict().values(),
                                                                  again.model.state_dict().values()))


@pytest.mark.parametrize("variant", ["vanilla", "sink-logit", "off-by-one"])
def test_variants_train_and_measure(tmp_path, monkeypatch, variant):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    run = train(variant_config(variant, steps=10, log_every=5), progress=False)
    x = BigramBackcopy().sample(4, 64, torch.Generator().manual_seed(1))
    mass = attention_on_sink(run, x)
    assert mass.shape == (run.config.n_layer, run.config.n_head) and bool(((mass >= 0) & (mass <= 1)).all())
    losses = window_losses(run, x, [4], [0, 1])
    assert set(losses["windows"][4]) == {0, 1} and losses["full"] > 0
    if variant == "off-by-one":
        assert not any(p.requires_grad for n, p in run.model.named_parameters() if "sink_logit" in n)


@pytest.mark.parametrize("bad", [dict(variant="sinks"), dict(task="music"), dict(steps=0), dict(seq_len=4),
                                 dict(lr=2.0), dict(d_model=30)])
def test_bad_training_configs(bad):
    with pytest.raises(ValueError, match="must be"):
        TrainConfig(**bad)


def test_train_cli_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    assert main(["train", "--variant", "sink-logit", "--steps", "12", "--windows", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("variant", "steps", "seconds", "final_loss", "sink_mass", "full_loss", "window_loss"):
        assert key in out
    assert set(out["window_loss"]["W=4"]) == {"0", "1", "2", "4"} and out["steps"] == 12


def test_building_the_task_leaves_the_global_generator_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    a = BigramBackcopy()
    assert torch.equal(torch.rand(3), expected)
    assert torch.equal(BigramBackcopy().transition, a.transition)  # still fixed by its own seed


def test_seed_list_and_its_bounds():
    assert seed_list(5) == [5, 6, 7] and MIN_SEEDS == 3
    assert seed_list(0, 4) == [0, 1, 2, 3]
    assert seed_list(SEED_MAX - 2) == [SEED_MAX - 2, SEED_MAX - 1, SEED_MAX]
    for n in (1, 2, 0, -3, 2.5, True, "3"):
        with pytest.raises(ValueError, match=r"number of seeds must be an integer >= 3 .*anecdote"):
            seed_list(0, n)
    for seed in (-1, SEED_MAX - 1, 1.0, False):
        with pytest.raises(ValueError, match=rf"seed must be an integer from 0 to {SEED_MAX - 2} "):
            seed_list(seed)


def test_over_seeds_summarises_every_value():
    line = over_seeds([0.5, 0.1, 0.3])
    assert line == "median 0.300, mean 0.300, range 0.100 to 0.500 over 3 seeds"
    assert over_seeds([1, 2, 4, 10], ".1f") == "median 3.0, mean 4.2, range 1.0 to 10.0 over 4 seeds"
    for bad in ([0.2], [0.1, float("nan"), 0.3]):
        with pytest.raises(ValueError, match="at least two finite values"):
            over_seeds(bad)


def test_train_seeds_trains_one_model_per_seed(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    runs = train_seeds("vanilla", "fast", [4, 5, 6], progress=False, steps=3, log_every=1)
    assert [r.config.seed for r in runs] == [4, 5, 6] and all(r.config.steps == 3 for r in runs)
    assert len({r.path for r in runs}) == 3
    first = [next(iter(r.model.state_dict().values())) for r in runs]
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    again = train_seeds("vanilla", "fast", [4, 5, 6], progress=False, steps=3, log_every=1)
    assert all(r.loaded for r in again)
    for bad in ([0, 1], [0, 1, 1]):
        with pytest.raises(ValueError, match="seeds must be at least 3 different seeds"):
            train_seeds("vanilla", "fast", bad, progress=False, steps=3)


def test_train_cli_all_variants_over_seeds(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    assert main(["train", "--all-variants", "--seeds", "3", "--seed", "7", "--steps", "2", "--windows", "2",
                 "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["variant"], r["seed"]) for r in runs] == [(v, s) for v in ("vanilla", "sink-token", "sink-logit",
                                                                          "off-by-one") for s in (7, 8, 9)]
    assert main(["train", "--seeds", "2", "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --seeds/--seed:") and "number of seeds must be an integer >= 3" in err
    assert len(err.splitlines()) == 1


def test_fast_preset_is_smaller_than_full():
    fast, full = variant_config("sink-token", "fast"), variant_config("sink-token", "full")
    work = lambda c: c.steps * c.batch * c.seq_len * c.n_layer * c.d_model
    assert work(fast) * 8 < work(full)  # about 20 s per model on two CPU cores instead of several minutes
