"""The command line, end to end on the offline model."""

from __future__ import annotations

import json

import pytest

from course.__main__ import main


def run_json(capsys, *argv) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_info(capsys):
    info = run_json(capsys, "info")
    assert info["models"]["smollm2-135m"] is True and info["corpora"]["austen"] is True
    assert info["device"] in ("cpu", "cuda")


def test_stream_json(capsys):
    out = run_json(capsys, "stream", "--model", "smollm2-135m", "--policy", "streaming", "--sinks", "4",
                   "--budget", "64", "--tokens", "200")
    for key in ("model", "policy", "sinks", "budget", "tokens", "ppl", "ppl_after_fill", "max_cache_bytes", "seconds"):
        assert key in out
    assert out["tokens"] == 200 and out["sinks"] == 4 and out["budget"] == 64 and out["positions"] == "cache"
    assert out["max_cache_bytes"] == 2 * 30 * 3 * 64 * 4 * 64  # 64 slots, float32
    assert 5 < out["ppl"] < 60


def test_stream_text_file(capsys, tmp_path):
    f = tmp_path / "story.txt"
    f.write_text("Once upon a time there was a cache that never forgot its first token. " * 20)
    out = run_json(capsys, "stream", "--text-file", str(f), "--policy", "window", "--budget", "32", "--tokens", "100")
    assert out["policy"] == "window" and out["ppl_after_fill"] is not None


@pytest.mark.slow
def test_stream_on_the_gpt2_shaped_model_picks_its_rule_and_respects_its_limit(capsys):
    out = run_json(capsys, "stream", "--model", "gpt2-random", "--budget", "64", "--tokens", "1024")
    assert out["positions"] == "original" and out["sinks"] == 4 and out["tokens"] == 1024
    assert main(["stream", "--model", "gpt2-random", "--tokens", "1025"]) == 2
    assert "--tokens needs 1025 token positions but gpt2-random has 1024" in capsys.readouterr().err
    assert main(["stream", "--model", "gpt2-random", "--positions", "cache", "--tokens", "10"]) == 2
    assert "(GPT-2 family) cannot do" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["stream", "--tokens", "0"], "must be an integer >= 1"),
    (["stream", "--policy", "lru"], "invalid choice"),
    (["stream", "--model", "gpt-9"], "or a Hugging Face checkpoint"),
])
def test_bad_arguments_exit_with_a_message(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bad_values_exit_cleanly(capsys, tmp_path):
    assert main(["stream", "--tokens", "10000000", "--book", "persuasion"]) == 2
    assert "fewer than n_tokens" in capsys.readouterr().err
    assert main(["stream", "--book", "ulysses", "--tokens", "10"]) == 2
    assert "book must be one of" in capsys.readouterr().err


@pytest.mark.slow
def test_needle_json(capsys):
    out = run_json(capsys, "needle", "--policy", "snapkv", "--budget", "128", "--trials", "2", "--context", "200")
    for key in ("accuracy", "mean_answer_logprob", "budget", "policy"):
        assert key in out
    assert out["budget"] == 128 and out["policy"] == "snapkv" and 0.0 <= out["accuracy"] <= 1.0
    sweep = run_json(capsys, "needle", "--policy", "streaming", "--budget", "16", "32", "--trials", "1", "--context", "100")
    assert [r["budget"] for r in sweep] == [16, 32]


def test_needle_bad_depth(capsys):
    with pytest.raises(SystemExit) as e:  # refused while parsing, before the model loads
        main(["needle", "--depth", "1.5"])
    assert e.value.code == 2
    assert "--depth: must be a number from 0 to 1, got '1.5'" in capsys.readouterr().err
