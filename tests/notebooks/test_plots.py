"""Every plotting function of course.plots, drawn (Agg) on small made-up data: each axes names both axes and
holds data, lines differ by style as well as colour, log axes read as plain numbers, the legend covers
(almost) no data, the axes end where the data ends, and titles follow the numbers."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course import head_plots, plots  # noqa: E402

RNG = np.random.default_rng(0)


def stream_curves(T: int = 600, budget: int = 100) -> dict[str, np.ndarray]:
    base = 3.0 + 0.5 * RNG.standard_normal(T)
    window = base.copy()
    window[budget:] += 2.0
    return {"StreamingLLM": base + 0.01, "sinks, original positions": base + 0.03, "window only": window}


FIGURES = {
    "cache_size_plot": lambda: plots.cache_size_plot({"gpt2": 36_864, "llama-7b": 524_288},
                                                     [512, 2048, 8192, 32768], batches=(1, 16)),
    "decode_cost_plot": lambda: plots.decode_cost_plot({"context": [64, 128, 256, 512],
                                                        "recompute": [0.02, 0.035, 0.07, 0.15],
                                                        "cached": [0.010, 0.011, 0.011, 0.012]}),
    "attention_heatmap": lambda: plots.attention_heatmap(torch.softmax(torch.randn(16, 16), -1).tril(),
                                                         [f"t{i}" for i in range(16)], title="layer 1"),
    "sink_mass_plot": lambda: plots.sink_mass_plot(torch.rand(6, 4), uniform=0.02, title="mass on token 0"),
    "nll_along_stream": lambda: plots.nll_along_stream(stream_curves(), smooth=16,
                                                       marks={"cache full": 100, "trained context": 8192}),
    "bar_compare": lambda: plots.bar_compare({"first 4": 23.1, "middle 4": 61.0, "none": 182.0},
                                             reference={"first 4": 9.6, "none": 3359.9}),
    "lines_plot (log y, under a decade)": lambda: plots.lines_plot(
        [5, 10, 20, 50], {"window": [61, 39.5, 29.8, 25.1], "StreamingLLM": [29.5, 26.8, 24.9, 23.6],
                          "H2O": [28.1, 25.2, 23.6, 22.9], "dense": [22.4] * 4},
        "cache budget (% of the stream)", "perplexity", "policies vs budget", logy=True),
    "lines_plot (dense x)": lambda: plots.lines_plot(
        list(range(0, 2048, 16)), {"dense": [t * 0.1 for t in range(0, 2048, 16)], "StreamingLLM": [6.4] * 128},
        "tokens streamed", "KV cache (MiB)", "memory"),
    "kept_tokens_figure": lambda: plots.kept_tokens_figure(["The", " cat", "\n", " sat"], [True, False, True, None],
                                                           title="streaming(4+60)"),
    "head_map": lambda: head_plots.head_map(torch.rand(6, 9) ** 6, title="3 of 54 heads above 0.1"),
    "accuracy_bars": lambda: head_plots.accuracy_bars({"full": (11, 12), "best 8 masked": (2, 12),
                                                       "8 random masked": (10, 12)}, title="12 prompts"),
    "head_frontier": lambda: head_plots.head_frontier(
        [{"method": m, "budget": b, "bytes": b / 350, "right": r, "trials": 12, "ppl_ratio": q}
         for m, rows in {"StreamingLLM": [(48, 0, 1.2), (96, 1, 1.1)], "DuoAttention": [(48, 6, 1.15), (96, 10, 1.05)],
                         "SnapKV": [(48, 7, 1.1), (96, 11, 1.04)]}.items() for b, r, q in rows],
        title="equal bytes"),
}


def data_axes(fig) -> list:
    """The figure's plotting axes (colour bars left out)."""
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def has_data(ax) -> bool:
    return bool(ax.get_lines() or ax.get_images() or ax.patches or ax.collections or ax.texts)


@pytest.fixture(params=list(FIGURES), ids=list(FIGURES))
def figure(request):
    fig = FIGURES[request.param]()
    fig.canvas.draw()
    yield request.param, fig
    plt.close(fig)


def test_every_axes_has_labels_a_title_and_data(figure):
    name, fig = figure
    for ax in data_axes(fig):
        assert has_data(ax), f"{name}: an empty axes"
        if name == "kept_tokens_figure":  # running text, no axes to label
            continue
        assert ax.get_ylabel().strip(), f"{name}: no y label"
        if name == "bar_compare":  # categories: the tick labels name them
            assert all(t.get_text() for t in ax.get_xticklabels()), f"{name}: a bar without a name"
        else:
            assert ax.get_xlabel().strip(), f"{name}: no x label"
        assert ax.get_title().strip(), f"{name}: no title"


def test_log_axes_read_as_plain_numbers(figure):
    name, fig = figure
    for ax in data_axes(fig):
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() != "log":
                continue
            labels = [t.get_text() for t in axis.get_ticklabels(which="both") if t.get_text()]
            assert labels, f"{name}: a log axis without a single labelled tick"
            odd = [t for t in labels if any(s in t for s in ("×", "^", "$", "e+", "e-"))]
            assert not odd, f"{name}: tick labels in scientific notation: {odd}"


def test_lines_differ_by_style_not_only_colour(figure):
    name, fig = figure
    for ax in data_axes(fig):
        lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1 and not ln.get_label().startswith("_")]
        styles = [(ln.get_linestyle(), ln.get_marker()) for ln in lines]
        assert len(set(styles)) == len(styles), f"{name}: lines told apart by colour only: {styles}"


def test_the_legend_covers_almost_no_data(figure):
    name, fig = figure
    for ax in data_axes(fig):
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent()
        points = np.concatenate([ln.get_transform().transform(ln.get_xydata()) for ln in ax.get_lines()
                                 if len(ln.get_xdata()) > 1] or [np.empty((0, 2))])
        if len(points):
            covered = ((points[:, 0] >= box.x0) & (points[:, 0] <= box.x1)
                       & (points[:, 1] >= box.y0) & (points[:, 1] <= box.y1)).mean()
            assert covered <= 0.05, f"{name}: the legend covers {covered:.0%} of the line points"


def test_a_stream_plot_ends_with_the_stream_and_draws_only_marks_inside_it():
    curves = stream_curves(T=600, budget=100)
    fig = plots.nll_along_stream(curves, smooth=16, marks={"cache full": 100, "trained context": 8192})
    ax = fig.axes[0]
    assert ax.get_xlim() == (0, 600)
    vertical = [ln.get_xdata()[0] for ln in ax.get_lines() if len(set(ln.get_xdata())) == 1]
    assert vertical == [100]
    plt.close(fig)


def test_titles_follow_the_numbers():
    fast = {"context": [64, 512], "recompute": [0.02, 0.16], "cached": [0.01, 0.01]}
    slow = {"context": [64, 512], "recompute": [0.02, 0.04], "cached": [0.01, 0.02]}
    titles = [plots.decode_cost_plot(c).axes[1].get_title() for c in (fast, slow)]
    assert titles == ["the cache is 16.0x faster at 512 tokens", "the cache is 2.0x faster at 512 tokens"]
    curves = stream_curves()
    best = plots.nll_along_stream(curves, marks={"cache full": 100}).axes[0].get_title()
    curves["window only"] = curves["window only"] - 5.0  # now the lowest
    worst = plots.nll_along_stream(curves, marks={"cache full": 100}).axes[0].get_title()
    assert best.endswith(": StreamingLLM") and worst.endswith(": window only")
    assert "2 of 2 layers" in plots.sink_mass_plot(torch.tensor([[0.9, 0.8], [0.7, 0.9]]), 0.02).axes[1].get_title()
    assert "0 of 2 layers" in plots.sink_mass_plot(torch.tensor([[0.01, 0.02], [0.01, 0.0]]), 0.02).axes[1].get_title()
    plt.close("all")


@pytest.mark.parametrize(("x", "text"), [(70, "70"), (0.0012, "0.0012"), (2e5, "200000"), (3359.95, "3360"),
                                         (1, "1"), (0, "0")])
def test_plain_number(x, text):
    assert plots.plain_number(x) == text


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="series 'b' has 1 values for 2 x values"):
        plots.lines_plot([1, 2], {"a": [1, 2], "b": [1]}, "x (tokens)", "y")
    with pytest.raises(ValueError, match="axis must be 'x', 'y' or 'both'"):
        plots.plain_ticks(plt.figure().add_subplot(), "z")
    with pytest.raises(ValueError, match=r"mass must be a non-empty \[layers, heads\]"):
        plots.sink_mass_plot(torch.rand(4))
    with pytest.raises(ValueError, match="curves must hold at least one"):
        plots.nll_along_stream({})
    plt.close("all")


def test_the_course_style_gives_every_line_its_own_style():
    with matplotlib.rc_context():
        plots.use_course_style()
        fig, ax = plt.subplots()
        lines = [ax.plot([0, 1], [i, i])[0] for i in range(4)]
        assert len({ln.get_linestyle() for ln in lines}) == 4 and len({ln.get_color() for ln in lines}) == 4
        plt.close(fig)
