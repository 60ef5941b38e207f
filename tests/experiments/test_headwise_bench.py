"""``bench``'s head-wise rows (course.instructor.headwise_bench) on a tiny model: every contender at the same bytes
as uniform SnapKV, the table printed (times are measured, not asserted)."""

from __future__ import annotations

import pytest
import torch

from course.instructor.headwise_bench import bench_headwise, far_attention, headwise_table

from tests.conftest import tiny_model

CONTENDERS = ["full", "streaming", "snapkv", "duo_attention", "ada_kv", "pyramid_kv"]


def test_far_attention_is_a_share_of_each_kv_head_s_attention():
    model = tiny_model("llama", dtype=torch.float32)
    far = far_attention(model, torch.randint(0, 97, (1, 60)), window=8)
    c = model.config
    assert far.shape == (c.n_layer, c.n_kv_head) and bool(((far >= 0) & (far <= 1 + 1e-5)).all())
    with pytest.raises(ValueError, match="probe"):
        far_attention(model, torch.randint(0, 97, (1, 10)), window=8)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_head_wise_bench_holds_every_contender_at_snapkv_s_bytes(family, capsys):
    pytest.importorskip("course.headwise", reason="the head-wise cache (course.headwise) is not merged yet")
    model = tiny_model(family, dtype=torch.float32)
    r = bench_headwise(model, torch.randint(0, 97, (1, 80)), prompt=48, budget=16, steps=1, reps=1)
    rows = r["rows"]
    assert list(rows) == CONTENDERS
    assert rows["full"]["bytes_over_snapkv"] == pytest.approx(48 / 16)
    for name in ("streaming", "duo_attention", "ada_kv", "pyramid_kv"):
        assert rows[name]["bytes"] == rows["snapkv"]["bytes"], name
    assert all(row["ms_per_token"] > 0 for row in rows.values())
    print(headwise_table(r))
    assert "| duo_attention |" in capsys.readouterr().out


def test_the_head_wise_bench_refuses_bad_sizes():
    model = tiny_model("llama", dtype=torch.float32)
    with pytest.raises(ValueError, match="budget"):
        bench_headwise(model, torch.randint(0, 97, (1, 40)), prompt=48, budget=16, steps=1, reps=1)


def test_the_head_wise_table_renders():
    rows = {name: {"label": name, "ms_per_token": 1.5, "bytes": 4096, "time_over_snapkv": 1.25,
                   "bytes_over_snapkv": 1.0} for name in CONTENDERS}
    text = headwise_table({"prompt": 48, "budget": 16, "rows": rows})
    assert "| ada_kv | ada_kv | 1.50 | 4 | 1.25 | 1.00 |" in text and "48-token prompt" in text
