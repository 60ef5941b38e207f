"""The benchmark functions, on tiny models (the numbers are not asserted: only their shape and sanity)."""

from __future__ import annotations

import pytest
import torch

from course.instructor.bench import bench_evaluator, bench_vs_transformers, markdown_tables, peak_memory
from course.timing import bench_policies, compressed_prompt_speedup
from course.models import from_transformers
from course.policies import StreamingLLM

from tests.conftest import tiny_model
from tests.models.test_models import random_hf


def test_bench_vs_transformers_runs_on_the_same_weights():
    hf = random_hf("llama")
    model = from_transformers(hf)
    ids = torch.randint(0, 101, (1, 64))
    r = bench_vs_transformers(model, hf, ids, context=16, steps=2, reps=2)
    assert r["course_ms"] > 0 and r["transformers_ms"] > 0 and r["ratio"] > 0


def test_bench_evaluator_reports_identical_nll():
    model = tiny_model("llama", dtype=torch.float32)
    r = bench_evaluator(model, torch.randint(0, 97, (1, 60)), lambda: StreamingLLM(2, 10), chunk=16)
    assert r["tokens"] == 59 and r["max_nll_diff"] <= 1e-4 and r["ratio"] > 0


def test_bench_policies_cache_bytes_follow_each_policy():
    model = tiny_model("llama", dtype=torch.float32)
    r = bench_policies(model, torch.randint(0, 97, (1, 8)), [20, 200], budget=16, steps=1, reps=1)
    per = r["per_policy"]
    slot = 2 * model.config.n_layer * model.config.n_kv_head * model.config.head_dim * 4
    assert per["full"]["cache_bytes"] == [20 * slot, 200 * slot]  # grows with the stream
    assert per["streaming"]["cache_bytes"] == [16 * slot, 16 * slot]  # flat
    assert per["h2o"]["cache_bytes"] == [16 * slot, 16 * slot]
    assert per["snapkv"]["cache_bytes"] == [16 * slot, (16 + 200 - 20) * slot]  # compressed prompt, then grows
    assert r["h2o_over_streaming"] > 0 and peak_memory(torch.device("cpu"))["peak_rss_mib"] > 0


def test_bench_policies_rejects_lengths_below_the_budget():
    model = tiny_model("llama", dtype=torch.float32)
    with pytest.raises(ValueError, match="lengths"):
        bench_policies(model, torch.randint(0, 97, (1, 8)), [8, 200], budget=16, steps=1, reps=1)


def test_markdown_tables_render():
    fake = {
        "model": "m", "device": "cpu", "quick": True, "seconds": 1.0, "memory": {"peak_rss_mib": 10.0},
        "machine": {"processor": "x86_64", "cpu_threads": 2, "torch": "2.x"},
        "decode": {"context": 16, "course_ms": 1.0, "transformers_ms": 2.0, "ratio": 0.5},
        "streaming": {"cache_tokens": 16, "recompute": 0.02, "streaming": 0.001, "speedup": 20.0},
        "evaluator": {"tokens": 10, "policy": "p", "exact_tok_s": 100.0, "decode_tok_s": 5.0, "ratio": 20.0,
                      "max_nll_diff": 0.0},
        "snapkv_prefill": {"prompt": 8, "snapkv_ms": 2.0, "plain_ms": 1.0, "ratio": 2.0},
        "policies": {"budget": 4, "h2o_over_streaming": 1.5, "snapkv_over_streaming": 1.0,
                     "per_policy": {name: {"tokens": [1, 2], "ms_per_token": [1.0, 2.0], "cache_bytes": [1, 2]}
                                    for name in ("full", "snapkv")}},
        "headwise": {"prompt": 8, "budget": 4, "rows": {"ada_kv": {
            "label": "adakv(4)", "ms_per_token": 1.0, "bytes": 2048, "time_over_snapkv": 1.1,
            "bytes_over_snapkv": 1.0}}},
    }
    text = markdown_tables(fake)
    assert "| decode, 16-token context |" in text and "t=2" in text
    assert "| ada_kv | adakv(4) | 1.00 | 2 | 1.10 | 1.00 |" in text


def test_compressed_prompt_speedup_times_both_caches_at_every_length():
    model = tiny_model("llama", dtype=torch.float32)
    r = compressed_prompt_speedup(model, [20, 200], budget=16, steps=1, reps=2)
    slot = 2 * model.config.n_layer * model.config.n_kv_head * model.config.head_dim * 4
    assert [len(s) for s in r["speedups"]] == [2, 2]          # one ratio per repetition, at every length
    assert r["tokens"] == [20, 200] and r["budget"] == 16
    assert r["full_bytes"] == [20 * slot, 200 * slot] and r["snapkv_bytes"] == [16 * slot, 16 * slot]
    assert all(ms > 0 for ms in r["full_ms"] + r["snapkv_ms"])
    assert r["speedup"] == pytest.approx([f / s for f, s in zip(r["full_ms"], r["snapkv_ms"])])


@pytest.mark.parametrize("lengths, budget, match", [([8, 200], 16, "lengths"), ([200, 20], 16, "lengths"),
                                                    ([], 16, "lengths"), ([20, 252], 16, "positions")])
def test_compressed_prompt_speedup_refuses_bad_sizes(lengths, budget, match):
    model = tiny_model("gpt2", dtype=torch.float32)   # 256 learned positions: 252 + 6 timed steps do not fit
    with pytest.raises(ValueError, match=match):
        compressed_prompt_speedup(model, lengths, budget=budget, steps=2, reps=2)


def test_the_longest_prompt_that_fits_a_budget_with_and_without_snapkv():
    from course.kvcache import longest_prompt, prefill_bytes_per_token

    cfg = tiny_model("llama", dtype=torch.float32).config
    act, cache = prefill_bytes_per_token(cfg, 4), cfg.cache_bytes_per_token(4)
    assert act == max(2 * 32 + 3 * 4 * 8 + 3 * 2 * 8 + 32, 3 * 32 + 4 * 64) * 4   # the MLP's SwiGLU is the widest
    weights, tokens = 10**6, 4096
    memory = weights + (act + cache) * tokens
    assert longest_prompt(memory, weights, cfg, 4) == tokens                     # the whole cache fits exactly
    kept = longest_prompt(memory, weights, cfg, 4, keep=tokens // 8)
    assert tokens < kept < tokens * cfg.n_layer                                  # SnapKV fits more, not unboundedly
    assert longest_prompt(weights - 1, weights, cfg, 4) == 0
