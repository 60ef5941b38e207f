"""The interactive explorers, driven through the plain functions their callbacks call."""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.figure import Figure

from course import plots
from course.attention_analysis import attention_maps
from course.policies import H2O, SlidingWindow, SnapKV, StreamingLLM
from course.streaming import decode_stream, evaluate_stream
from course.widgets import (
    CacheView,
    attention_explorer,
    attention_view,
    cache_explorer,
    cache_view,
    explorer_policy,
    head_sink_mass,
    kept_tokens_html,
    run_policy,
    token_strings,
)

from tests.conftest import tiny_model


class WordTokenizer:
    """A stand-in tokenizer for the tiny models' 97-token vocabulary: id i reads " w<i>", 0 is a newline."""

    def decode(self, ids: list[int]) -> str:
        return "".join("\n" if i == 0 else f" w{i}" for i in ids)


def find(box: widgets.Widget, kind: type) -> list[widgets.Widget]:
    """Every widget of a type inside a box, depth first."""
    found = [box] if isinstance(box, kind) else []
    for child in getattr(box, "children", ()):
        found += find(child, kind)
    return found


def control(box: widgets.Widget, description: str) -> widgets.Widget:
    (w,) = [w for w in find(box, widgets.ValueWidget) if getattr(w, "description", None) == description]
    return w


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    return tiny_model("llama"), torch.randint(1, 97, (1, 40))


# ----------------------------------------------------------------------------- attention explorer
def test_attention_view_shows_the_heatmap_and_the_sink_mass_of_one_head(tiny):
    model, ids = tiny
    maps = attention_maps(model, ids)
    tokens = [f"t{i}" for i in range(ids.shape[1])]
    for layer, head in [(0, 0), (1, 3)]:
        fig, text = attention_view(maps, tokens, layer, head)
        expected = maps[layer][0, head, 4:, 0].mean().item()  # token 0's share, queries 4.. on
        assert isinstance(fig, Figure) and fig.axes[0].get_title() == f"layer {layer}, head {head}"
        assert head_sink_mass(maps, layer, head) == pytest.approx(expected, rel=1e-6)
        assert f"sink mass {expected:.3f}" in text
        plt.close(fig)


def test_attention_view_names_the_parameter_out_of_range(tiny):
    model, ids = tiny
    maps = attention_maps(model, ids)
    tokens = ["t"] * ids.shape[1]
    with pytest.raises(ValueError, match="layer must be an integer between 0 and 1, got 2"):
        attention_view(maps, tokens, 2, 0)
    with pytest.raises(ValueError, match="head must be an integer between 0 and 3, got 4"):
        attention_view(maps, tokens, 0, 4)
    with pytest.raises(ValueError, match="one string per query"):
        attention_view(maps, tokens[:-1], 0, 0)


def test_attention_explorer_sliders_update_the_view(tiny):
    model, ids = tiny
    maps = attention_maps(model, ids)
    box = attention_explorer(maps, [f"t{i}" for i in range(ids.shape[1])])
    (image,), (caption,) = find(box, widgets.Image), find(box, widgets.HTML)
    png = bytes(image.value)
    assert png.startswith(b"\x89PNG") and "layer 0, head 0" in caption.value
    control(box, "head").value = 3
    assert "layer 0, head 3" in caption.value and bytes(image.value) != png
    control(box, "layer").value = 1
    assert caption.value.startswith("layer 1, head 3") and f"{head_sink_mass(maps, 1, 3):.3f}" in caption.value


# ----------------------------------------------------------------------------- cache explorer
def _decoded_positions(model, ids, policy) -> list[list[list[int]]]:
    """Positions in the decode loop's final cache, per layer and KV head (sorted)."""
    def positions(cache) -> dict:
        return {"p": [cache.positions(i)[0].sort(-1).values.tolist() for i in range(len(cache.layers))]}

    return decode_stream(model, ids, policy, progress=False, inspect=positions).extra["p"]


def test_window_keeps_exactly_the_last_w_tokens(tiny):
    model, ids = tiny
    n, w = ids.shape[1], 16
    view = cache_view(model, WordTokenizer(), ids, "window", w, 0)
    assert view.kept == set(range(n - 1 - w, n - 1))  # the last token is only predicted
    assert view.mask[-1] is None and view.mask.count(True) == w and view.mask.count(False) == n - 1 - w
    assert view.run.positions.tolist() == _decoded_positions(model, ids, SlidingWindow(w))


def test_streaming_keeps_sinks_and_the_recent_window(family):
    model, ids = tiny_model(family), torch.randint(1, 97, (1, 40))
    n, positions = ids.shape[1], "original" if family == "gpt2" else "cache"
    view = cache_view(model, WordTokenizer(), ids, "streaming", 16, 4, layer=1, kv_head=1)
    assert view.kept == set(range(4)) | set(range(n - 1 - 12, n - 1))
    assert view.run.positions.tolist() == _decoded_positions(model, ids, StreamingLLM(4, 12, positions))


@pytest.mark.parametrize(("name", "sinks", "policy"), [
    ("window", 0, SlidingWindow(16)), ("streaming", 4, StreamingLLM(4, 12)), ("h2o", 0, H2O(8, 8)),
    ("snapkv", 0, SnapKV(16)),
])
def test_reported_ppl_is_evaluate_streams(tiny, name, sinks, policy):
    model, ids = tiny
    view = cache_view(model, WordTokenizer(), ids, name, 16, sinks)
    assert view.run.label == policy.label
    assert view.ppl == pytest.approx(evaluate_stream(model, ids, policy, progress=False).ppl(), rel=1e-9)


def test_h2o_and_snapkv_keep_a_budget_per_head_with_their_protected_tokens(tiny):
    model, ids = tiny
    n = ids.shape[1]
    h2o = run_policy(model, ids, H2O(8, 8))
    assert h2o.positions.tolist() == _decoded_positions(model, ids, H2O(8, 8))
    snap = run_policy(model, ids, SnapKV(16))  # the text but its last token is the prompt
    for run in (h2o, snap):
        assert run.positions.shape == (2, 2, 16)
    recent = set(range(n - 1 - 8, n - 1))  # H2O's recent half; SnapKV's observation window
    for layer in range(2):
        for head in range(2):
            assert recent <= set(h2o.positions[layer, head].tolist())
            assert recent <= set(snap.positions[layer, head].tolist())
    assert not torch.equal(snap.positions[0, 0], snap.positions[1, 1]), "SnapKV chooses per layer and head"


def test_explorer_policies_and_their_errors():
    assert explorer_policy("streaming", 32, 2).label == "streaming(2+30)"
    assert explorer_policy("streaming", 32, 2, model=tiny_model("gpt2")).position_rule == "original"
    assert explorer_policy("streaming", 32, 2, model=tiny_model("llama")).position_rule == "cache"
    assert explorer_policy("h2o", 32, 4).label == "h2o(16+16)+4 sinks"
    with pytest.raises(ValueError, match="sinks must be 0 for 'window'"):
        explorer_policy("window", 32, 2)
    with pytest.raises(ValueError, match="sinks must be between 1 and 8 for 'streaming', got 0"):
        explorer_policy("streaming", 32, 0)
    with pytest.raises(ValueError, match="policy must be one of"):
        explorer_policy("lru", 32, 0)


def test_cache_view_checks_layer_head_and_ids(tiny):
    model, ids = tiny
    with pytest.raises(ValueError, match="kv_head must be an integer between 0 and 1, got 2"):
        cache_view(model, WordTokenizer(), ids, "window", 16, 0, kv_head=2)
    with pytest.raises(ValueError, match=r"ids must be one stream"):
        cache_view(model, WordTokenizer(), ids.expand(2, -1), "window", 16, 0)


def test_memo_reuses_runs_and_views_render(tiny):
    model, ids = tiny
    memo: dict = {}
    a = cache_view(model, WordTokenizer(), ids, "h2o", 16, 0, memo=memo)
    b = cache_view(model, WordTokenizer(), ids, "h2o", 16, 0, layer=1, kv_head=1, memo=memo)
    assert len(memo) == 1 and a.run is b.run
    assert isinstance(b, CacheView) and b.tokens == token_strings(WordTokenizer(), ids)
    assert plots.KEPT_COLOUR in b.html and plots.EVICTED_COLOUR in b.html
    fig = b.figure()
    assert "h2o(8+8)" in fig.texts[0].get_text()
    plt.close(fig)


def test_kept_tokens_renderers_check_lengths_and_show_newlines():
    tokens, kept = ["a", "\n", "b"], [True, False, None]
    assert kept_tokens_html(tokens, kept).count("<span") == 3 and "↵" in kept_tokens_html(tokens, kept)
    fig = plots.kept_tokens_figure(tokens, kept, "t")
    assert [t.get_text() for t in fig.axes[0].texts] == ["a", "↵", "b"]
    plt.close(fig)
    with pytest.raises(ValueError, match="one entry per token"):
        kept_tokens_html(tokens, kept[:2])
    with pytest.raises(ValueError, match="one entry per token"):
        plots.kept_tokens_figure(tokens, kept[:2])


def test_cache_explorer_controls_update_the_view(tiny):
    model, ids = tiny
    box = cache_explorer(model, WordTokenizer(), ids)
    status, text = find(box, widgets.HTML)
    policy, budget, sinks = control(box, "policy"), control(box, "budget"), control(box, "sinks")
    assert "window(38)" in status.value and sinks.disabled  # the default budget (64) capped at T - 2
    first = text.value
    budget.value = 16
    assert "window(16)" in status.value and text.value != first
    policy.value = "streaming"
    assert not sinks.disabled and sinks.min == 1 and "streaming(4+12)" in status.value
    sinks.value = 2
    assert "streaming(2+14)" in status.value
    policy.value = "h2o"
    assert sinks.min == 0 and "h2o(8+8)+2 sinks" in status.value and "layer 0, KV head 0" in status.value
    control(box, "KV head").value = 1
    assert "layer 0, KV head 1" in status.value
    with pytest.raises(ValueError, match="max_tokens must be between 18 and 1024"):
        cache_explorer(model, WordTokenizer(), ids, max_tokens=8)
    with pytest.raises(ValueError, match="policies must be a non-empty list of full, window"):
        cache_explorer(model, WordTokenizer(), ids, policies=("window", "lru"))


# ----------------------------------------------------------------------------- SmolLM2
def test_explorers_on_smollm2(smollm2, austen_ids):
    model, tokenizer, _ = smollm2
    ids = austen_ids[:, :96]
    maps = attention_maps(model, ids[:, :64])
    tokens = token_strings(tokenizer, ids[:, :64])
    layer = len(maps) // 2
    best = max(range(maps[0].shape[1]), key=lambda h: head_sink_mass(maps, layer, h))
    fig, text = attention_view(maps, tokens, layer, best)
    plt.close(fig)
    assert head_sink_mass(maps, layer, best) > 0.5, "a middle layer should have a head that sinks into token 0"
    memo: dict = {}
    streaming = cache_view(model, tokenizer, ids, "streaming", 32, 4, memo=memo)
    window = cache_view(model, tokenizer, ids, "window", 32, 0, memo=memo)
    assert streaming.kept == set(range(4)) | set(range(95 - 28, 95))
    assert streaming.ppl == pytest.approx(evaluate_stream(model, ids, StreamingLLM(4, 28), progress=False).ppl())
    assert window.run.ppl_after_fill > 2 * streaming.run.ppl_after_fill, "evicting the sink should hurt"
    assert "".join(streaming.tokens) == tokenizer.decode(ids[0])
