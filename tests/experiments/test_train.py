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
    TABLE3,
    THRESHOLDS,
    BigramBackcopy,
    TrainConfig,
    agreement,
    attention_on_first,
    attention_on_sink,
    lm_loss,
    over_seeds,
    prepend_sink,
    seed_list,
    table3_rule,
    table3_excess,
    train,
    train_seeds,
    uniform_first,
    variant_config,
    verdict,
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


@pytest.mark.parametrize("variant", ["vanilla", "sink-logit", "off-by-one", "gated"])
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
    gated = [n for n, p in run.model.named_parameters() if ".attn.gate." in n]
    assert (len(gated) == 2 * run.config.n_layer) == (variant == "gated"), gated  # W_θ and b in every layer


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


@pytest.mark.slow
def test_train_cli_all_variants_over_seeds(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    assert main(["train", "--all-variants", "--seeds", "3", "--seed", "7", "--steps", "2", "--windows", "2",
                 "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["variant"], r["bos"], r["seed"]) for r in runs] == [
        (v, True, s) for v in ("vanilla", "sink-token", "sink-logit", "off-by-one", "gated") for s in (7, 8, 9)
    ] + [("vanilla", False, s) for s in (7, 8, 9)]
    assert main(["train", "--seeds", "2", "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --seeds/--seed:") and "number of seeds must be an integer >= 3" in err
    assert len(err.splitlines()) == 1


@pytest.mark.slow
def test_train_cli_jobs_train_the_same_runs_in_processes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path / "serial"))
    argv = ["train", "--variant", "vanilla", "--seeds", "3", "--steps", "3", "--windows", "2"]
    assert main(argv + ["--json"]) == 0
    serial = json.loads(capsys.readouterr().out)["runs"]
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path / "jobs"))
    assert main(argv + ["--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "training 3 runs, 2 at once" in out and "[3/3] vanilla on bigram-backcopy" in out
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path / "jobs-json"))
    assert main(argv + ["--jobs", "2", "--json"]) == 0
    parallel = json.loads(capsys.readouterr().out)["runs"]
    assert [r["seed"] for r in parallel] == [0, 1, 2] and not any(r["loaded_from_cache"] for r in parallel)
    for a, b in zip(serial, parallel):  # other threads sum in another order: equal up to round-off
        assert a["final_loss"] == pytest.approx(b["final_loss"], abs=1e-3)
        assert a["full_loss"] == pytest.approx(b["full_loss"], abs=1e-3)
    assert main(argv + ["--jobs", "2", "--device", "cuda"]) == 2
    assert "--jobs 2: several training processes run on the CPU only" in capsys.readouterr().err


def test_fast_preset_is_smaller_than_full():
    fast, full = variant_config("sink-token", "fast"), variant_config("sink-token", "full")
    def work(c):
        return c.steps * c.batch * c.seq_len * c.n_layer * c.d_model

    assert work(fast) * 8 < work(full)  # about 40 s per model on two CPU cores instead of several minutes


def test_bos_begins_every_sample_and_is_never_a_target(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    x = BigramBackcopy().sample(2, 8, torch.Generator().manual_seed(0))
    for variant, n_prefix in (("vanilla", 1), ("sink-token", 2), ("sink-logit", 1)):
        run = train(variant_config(variant, steps=2, log_every=1, seq_len=8, bos=True), progress=False)
        inputs = run.inputs(x)
        assert run.n_prefix == n_prefix and inputs.shape == (2, 8 + n_prefix) and torch.equal(inputs[:, n_prefix:], x)
        assert bool((inputs[:, n_prefix - 1] == run.bos_id).all()) and run.bos_id != run.sink_id
        assert run.bos_id == run.model.config.vocab_size - 1 and int(x.max()) < run.sink_id
        if variant == "sink-token":
            assert bool((inputs[:, 0] == run.sink_id).all())
        losses = window_losses(run, x, [2], [0, 1])
        assert set(losses["windows"][2]) == {0, 1}
    plain = train(variant_config("vanilla", steps=2, log_every=1, seq_len=8, bos=False), progress=False)
    assert plain.n_prefix == 0 and torch.equal(plain.inputs(x), x) and plain.bos_id is None


def test_bos_is_on_in_the_presets_and_names_its_runs():
    assert variant_config("vanilla", "fast").bos and variant_config("vanilla", "full").bos
    on, off = variant_config("vanilla", "fast"), variant_config("vanilla", "fast", bos=False)
    assert on.run_name != off.run_name and "-bos-" in on.run_name and "bos" not in off.run_name
    with pytest.raises(ValueError, match="bos must be True or False"):
        TrainConfig(bos="yes")


def test_attention_on_first_against_uniform(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    assert uniform_first(5, 4) == pytest.approx(1 / 5)
    assert uniform_first(6, 4) == pytest.approx((1 / 5 + 1 / 6) / 2)
    with pytest.raises(ValueError, match="skip must be in"):
        uniform_first(4, 4)
    run = train(variant_config("vanilla", steps=1, log_every=1, bos=True), progress=False)
    with torch.no_grad():  # an untrained model with zero query weights attends uniformly
        for block in run.model.blocks:
            block.attn.qkv.weight[: run.model.config.d_model] = 0
            block.attn.qkv.bias[: run.model.config.d_model] = 0
    x = BigramBackcopy().sample(3, 20, torch.Generator().manual_seed(2))
    first = attention_on_first(run, x)
    assert first.shape == (run.config.n_layer, run.config.n_head)
    assert torch.allclose(first, torch.full_like(first, uniform_first(21)), atol=1e-5)


def test_table3_in_nats_and_the_verdicts():
    assert table3_excess("vanilla", 0) == pytest.approx(math.log(27.87 / 18.05))
    assert table3_excess("sink-token", 4) == 0 and table3_excess("sink-logit", 1) is None
    assert table3_excess("sink-token", 1) <= THRESHOLDS["T2"] < table3_excess("vanilla", 1)  # the paper's own reading
    assert table3_excess("vanilla", 1) - table3_excess("vanilla", 4) >= THRESHOLDS["T3"]
    assert all(table3_excess(v, 0) >= THRESHOLDS["T1"] for v in TABLE3)
    with pytest.raises(ValueError, match="kept must be one of"):
        table3_excess("vanilla", 3)
    assert verdict([True] * 5, True) == "reproduced"
    assert verdict([True, True, True], True) == "inconclusive at n = 3"   # every seed agrees, but 3 are too few
    assert verdict([True, False, True, True, True], True) == "inconclusive at n = 5"
    assert verdict([True] * 5, False) == "not reproduced at this scale"
    assert verdict([False] * 6, False) == "reproduced"
    assert verdict([True, False, False], None) == "held in 1/3 seeds (not in the paper)"
    with pytest.raises(ValueError, match="one outcome per seed"):
        verdict([], True)
    # one rule: the verdict printed per threshold is the reproduction row's (table3_rule on the per-seed values)
    assert agreement([True, False, False], False) == pytest.approx(2 / 3)
    t1 = THRESHOLDS["T1"]
    for excess in ([0.2, 0.01, 0.3], [0.2, 0.1, 0.3], [0.01, 0.02, 0.0], [0.2, 0.1, 0.3, 0.4, 0.06],
                   [0.01, 0.02, 0.0, 0.03, 0.04], [0.2, 0.1, 0.3, 0.01, 0.4]):
        held = [e >= t1 for e in excess]
        assert table3_rule("T1", "T1").verdict(excess)[0] == verdict(held, True)
    five = [0.002, 0.007, 0.001, 0.004, 0.0]
    assert table3_rule("T2", "T2@1").verdict(five)[0] == "reproduced"      # at most T2 = 0.01
    assert table3_rule("T2", "T2@1", paper=False).verdict(five)[0] == "not reproduced at this scale"
    assert table3_rule("T2", "T2@1").verdict([0.002, 0.007])[0] == "inconclusive at n = 2"
    with pytest.raises(ValueError, match="T1, T2@k or T3"):
        table3_rule("x", "T4")


def test_train_cli_without_bos(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    assert main(["train", "--variant", "vanilla", "--no-bos", "--steps", "3", "--windows", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bos"] is False and 0 < out["uniform_first"] < 1 and 0 <= out["attention_on_first"] <= 1
    assert main(["train", "--variant", "vanilla", "--steps", "3", "--windows", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bos"] is True


@pytest.mark.parametrize("variant, bos, name", [
    ("vanilla", True, "bigram-backcopy-bos-vanilla-seed0-b51657ce23"),
    ("gated", True, "bigram-backcopy-bos-gated-seed0-3180a0dc46"),
    ("sink-token", True, "bigram-backcopy-bos-sink-token-seed0-ca5690268e"),
    ("vanilla", False, "bigram-backcopy-vanilla-seed0-9bab1a0677"),
])
def test_run_names_of_stored_runs_do_not_change(variant, bos, name):
    # the names of runs trained and cached by earlier versions: a change here retrains every stored model
    assert variant_config(variant, "fast", bos=bos).run_name == name


def test_text_runs_read_only_their_splits_characters(monkeypatch):
    """Natural-text training (notebook 06, section 10) reads the characters its split may read, and says so; runs
    stored when it read every character, the exploration share included, get other names and are not loaded."""
    from dataclasses import replace

    from course import splits
    from course.assets import AUSTEN_BOOKS
    from course.data import load_text
    from course.training.tasks import TextBytes

    monkeypatch.setattr(splits, "DRAWN", [])
    confirmation, exploration = TextBytes("confirmation").data.numpy().tobytes(), TextBytes("exploration").data
    for book in AUSTEN_BOOKS.values():
        text = load_text("austen", book)
        start, _ = splits.split_range(len(text), "exploration")
        last = text[-300:].encode("utf-8")  # the novel's end: the exploration share's
        assert last not in confirmation and last in exploration.numpy().tobytes(), book
        assert text[start - 300 : start].encode("utf-8") in confirmation, book
    assert sorted((d["split"], d["source"]) for d in splits.drawn()) == sorted(
        (s, f"austen/{b}") for s in ("confirmation", "exploration") for b in AUSTEN_BOOKS.values())
    text_run = replace(variant_config("sink-token", "fast", bos=True), task="text")
    assert text_run.run_name == "text-bos-sink-token-seed0-f3d17c013a"  # was -137a4588bb, trained on every character
