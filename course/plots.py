"""Figures for the notebooks: pure matplotlib functions that take numbers and return a Figure.

Every figure follows the same rules: axes end where the data ends, lines differ by style and marker as well
as colour (``CYCLE``), ticks are plain numbers (never ``7×10^1``, also on log axes: ``plain_ticks``), every
axis names its unit, legends sit where they cover no data, and a title states what the data shows, computed
from the numbers. ``use_course_style()`` (run by every notebook's ``configure_parameters``) applies the same
cycle and grid to the figures a notebook draws itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import torch
from cycler import cycler
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter, NullFormatter

from course.stats import interval

__all__ = [
    "cache_size_plot", "decode_cost_plot", "attention_heatmap", "sink_mass_plot", "nll_along_stream",
    "bar_compare", "lines_plot", "plain_ticks", "plain_number", "use_course_style", "CYCLE", "LINE_CYCLE",
]

GIB = 2**30
# colour-blind-safe colours (Okabe-Ito), each with its own line style (and, for the few-point lines drawn
# here, its own marker): lines stay apart in grey too. LINE_CYCLE, without markers, is every figure's default.
LINE_CYCLE = (cycler(color=["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"])
              + cycler(linestyle=["-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (3, 1))]))
CYCLE = LINE_CYCLE + cycler(marker=["o", "s", "^", "D", "v", "P"])
STYLE = {"axes.prop_cycle": LINE_CYCLE, "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 8,
         "legend.framealpha": 0.85, "lines.markersize": 4, "axes.formatter.useoffset": False,
         "axes.formatter.use_mathtext": False, "axes.formatter.limits": (-4, 6)}


def use_course_style() -> None:
    """Apply the course's line cycle (colour and line style), grid and plain tick numbers (no offset, no
    exponent on linear axes) to every figure drawn from now on; log axes need ``plain_ticks``."""
    mpl.rcParams.update(STYLE)


def plain_number(x: float, digits: int = 3) -> str:
    """``x`` without an exponent, to ``digits`` significant digits: 70 -> "70", 0.0012 -> "0.0012", 2e5 -> "200000"."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    return np.format_float_positional(x, precision=digits, fractional=False, trim="-")


class _PlainLogFormatter(LogFormatter):
    """Log-axis labels as plain numbers (matplotlib's own choice of which ticks get a label)."""

    def _num_to_string(self, x, vmin, vmax):  # noqa: D401 - matplotlib hook
        return plain_number(x)


def plain_ticks(ax: plt.Axes, axis: str = "both") -> None:
    """Plain tick labels on ``ax``'s log axes (``axis``: "x", "y" or "both"); linear axes keep theirs."""
    if axis not in ("x", "y", "both"):
        raise ValueError(f"axis must be 'x', 'y' or 'both', got {axis!r}")
    for name in ("x", "y") if axis == "both" else (axis,):
        a = getattr(ax, f"{name}axis")
        if a.get_scale() == "log":
            a.set_major_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(1e9, 1e9)))
            lo, hi = sorted(getattr(ax, f"get_{name}lim")())
            few_decades = hi / max(lo, 1e-300) < 30  # under ~1.5 decades: label the minor ticks too
            a.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5))
                                  if few_decades else NullFormatter())


def _axes(figsize: tuple[float, float], ncols: int = 1, **kw) -> tuple[Figure, np.ndarray]:
    fig, axes = plt.subplots(1, ncols, figsize=figsize, squeeze=False, **kw)
    for ax in axes[0]:
        ax.set_prop_cycle(CYCLE)
        ax.grid(alpha=0.3, which="major")
    return fig, axes[0]


def _legend_below(ax: plt.Axes, n: int) -> None:
    """The legend under the axes, outside the data (for lines that fill the whole width)."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=1 if n > 2 else n, frameon=False)


def cache_size_plot(models: dict[str, int], contexts: Sequence[int], batches: Sequence[int] = (1, 8),
                    gpu_gib: float = 80) -> Figure:
    """KV-cache size (GiB) vs context length for several models; ``models`` maps name -> bytes per token.

    Each panel's title says at which context the largest cache passes a ``gpu_gib`` GPU (computed)."""
    if not models or not contexts or not batches:
        raise ValueError("models, contexts and batches must each hold at least one entry")
    fig, axes = _axes((5.5 * len(batches), 4.2), len(batches))
    biggest = max(models, key=models.get)
    for ax, batch in zip(axes, batches):
        for name, per_token in models.items():
            ax.plot(contexts, [per_token * t * batch / GIB for t in contexts], label=name)
        top = max(gpu_gib, max(models.values()) * max(contexts) * batch / GIB) * 4  # room for the GPU's label
        ax.set(xscale="log", yscale="log", xlabel="context length (tokens)", ylabel="KV cache (GiB)",
               xlim=(min(contexts) / 1.3, max(contexts) * 1.3), ylim=(None, top))
        ax.axhline(gpu_gib, color="grey", ls=":", lw=1)
        ax.annotate(f"{plain_number(gpu_gib)} GiB GPU", (0.01, gpu_gib), xycoords=("axes fraction", "data"),
                    xytext=(0, 3), textcoords="offset points", color="grey", fontsize=8)
        over = [t for t in contexts if models[biggest] * t * batch / GIB > gpu_gib]
        finding = (f"{biggest} passes {plain_number(gpu_gib)} GiB at {over[0]:,} tokens" if over else
                   f"all fit in {plain_number(gpu_gib)} GiB up to {max(contexts):,} tokens")
        ax.set_title(f"batch {batch}: {finding}", fontsize=10)
        ax.set_xticks(list(contexts), [f"{t:,}" for t in contexts])
        ax.xaxis.set_minor_formatter(NullFormatter())
        plain_ticks(ax, "y")
    axes[0].legend(loc="lower right")  # the lines rise from lower left to upper right
    fig.tight_layout()
    return fig


def decode_cost_plot(costs: dict) -> Figure:
    """Per-token time with and without a KV cache vs context (from ``decode_cost_vs_context``).

    ``costs``: "context" (tokens), "recompute" and "cached" (seconds per token), one value per context."""
    ctx = list(costs["context"])
    rec, cached = np.asarray(costs["recompute"], float), np.asarray(costs["cached"], float)
    if not ctx or len(rec) != len(ctx) or len(cached) != len(ctx):
        raise ValueError("costs must hold one recompute and one cached time per context, and at least one context")
    fig, (a, b) = _axes((11, 4), 2)
    a.plot(ctx, rec * 1e3, label="recompute (no cache)")
    a.plot(ctx, cached * 1e3, label="KV cache")
    a.set(xlabel="context length (tokens)", ylabel="time per new token (ms)", ylim=(0, None),
          title=f"from {ctx[0]:,} to {ctx[-1]:,} tokens: recompute x{rec[-1] / rec[0]:.1f}, "
                f"cached x{cached[-1] / cached[0]:.1f}")
    a.legend(loc="upper left")
    ratio = rec / cached
    b.plot(ctx, ratio, color=CYCLE.by_key()["color"][2], ls="-.", marker="^")
    b.set(xlabel="context length (tokens)", ylabel="speed-up (recompute time / cached time)", ylim=(0, None),
          title=f"the cache is {ratio[-1]:.1f}x faster at {ctx[-1]:,} tokens")
    for ax in (a, b):
        ax.title.set_fontsize(10)
    fig.tight_layout()
    return fig


def attention_heatmap(weights: torch.Tensor, tokens: Sequence[str] | None = None, title: str = "",
                      ax: plt.Axes | None = None, max_tokens: int = 64) -> Figure:
    """One attention map [T, S] (rows: queries), log-scaled so that small weights stay visible."""
    w = weights[:max_tokens, :max_tokens].float().numpy()
    fig = ax.figure if ax is not None else plt.figure(figsize=(5, 4.5))
    ax = ax or fig.add_subplot()
    im = ax.imshow(np.log10(w + 1e-6), cmap="magma", vmin=-4, vmax=0, interpolation="nearest")
    ax.set(title=title, xlabel="key (token position attended to)", ylabel="query (token position)")
    ax.title.set_fontsize(10)
    if tokens is not None and len(tokens) <= 32:
        labels = [repr(t)[1:-1][:8] for t in tokens[: w.shape[0]]]
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
        ax.set_yticks(range(len(labels)), labels, fontsize=6)
    bar = fig.colorbar(im, ax=ax, fraction=0.046, label="attention weight")
    bar.set_ticks([-4, -3, -2, -1, 0], labels=["0.0001", "0.001", "0.01", "0.1", "1"])
    return fig


def sink_mass_plot(mass: torch.Tensor, uniform: float | None = None, title: str = "") -> Figure:
    """Attention mass on the first token(s) ``mass`` [layers, heads]: heat map and the per-layer mean.

    With ``uniform`` (the share uniform attention would give), the right title counts the layers over 10x it."""
    m = mass.float().numpy()
    if m.ndim != 2 or m.size == 0:
        raise ValueError(f"mass must be a non-empty [layers, heads] tensor, got shape {tuple(mass.shape)}")
    fig, (a, b) = _axes((11, 4), 2, gridspec_kw={"width_ratios": [1.3, 1]})
    a.grid(False)
    im = a.imshow(m.T, aspect="auto", cmap="viridis", vmin=0, vmax=1, origin="lower")
    a.set(xlabel="layer", ylabel="head", title=title or "attention mass on the sink")
    fig.colorbar(im, ax=a, label="share of attention on the sink")
    per_layer = m.mean(1)
    b.bar(range(len(m)), per_layer, color=CYCLE.by_key()["color"][0])
    finding = f"mean over heads: {per_layer.mean():.0%} on the sink"
    if uniform is not None:
        b.axhline(uniform, color="grey", ls="--", label=f"uniform attention ({uniform:.3f})")
        b.legend(loc="upper left", bbox_to_anchor=(0, 1.0))
        finding = f"{int((per_layer > 10 * uniform).sum())} of {len(m)} layers over 10x uniform"
    b.set(xlabel="layer", ylabel="share of attention (mean over heads)", ylim=(0, 1.15), title=finding,
          xlim=(-0.6, len(m) - 0.4))
    for ax in (a, b):
        ax.title.set_fontsize(10)
    fig.tight_layout()
    return fig


def nll_along_stream(curves: dict[str, np.ndarray], smooth: int = 32, marks: dict[str, int] | None = None,
                     title: str = "", ylabel: str = "NLL (nats per token, running mean)") -> Figure:
    """Per-token NLL along a stream for several settings, smoothed by a running mean of ``smooth`` tokens.

    ``curves``: name -> NLL per position [T]. ``marks``: label -> position, drawn when inside the stream. The
    legend gives each curve's perplexity after the first mark (or over the stream) and the title the lowest."""
    if not curves:
        raise ValueError("curves must hold at least one setting")
    fig, (ax,) = _axes((10, 4.4))
    inside = {label: x for label, x in (marks or {}).items() if 0 <= x < max(len(c) for c in curves.values())}
    start = min(inside.values()) if inside else 0
    where = f"after {start} tokens" if start else "over the stream"
    ppl = {}
    for name, nll in curves.items():
        nll = np.asarray(nll, dtype=float)
        k = max(1, min(smooth, len(nll)))
        run = np.convolve(nll, np.ones(k) / k, mode="valid")
        ppl[name] = float(np.exp(nll[start:].mean())) if len(nll) > start else float("nan")
        ax.plot(np.arange(k - 1, k - 1 + len(run)), run, label=f"{name} (PPL {ppl[name]:.2f} {where})", lw=1.4,
                marker="none")
    longest = max(len(np.asarray(c)) for c in curves.values())
    ax.set_xlim(0, longest)
    for label, x in inside.items():
        ax.axvline(x, color="grey", ls="--", lw=1)
        ax.annotate(f" {label}", (x, 0.97), xycoords=("data", "axes fraction"), color="grey", fontsize=8, va="top")
    best = min(ppl, key=ppl.get)
    finding = f"lowest perplexity {where}: {best}"
    ax.set(xlabel="position in the stream (tokens)", ylabel=ylabel)
    ax.set_title(f"{title}\n{finding}" if title else finding, fontsize=10)
    _legend_below(ax, len(curves))
    fig.tight_layout()
    return fig


def bar_compare(values: dict[str, float], reference: dict[str, float] | None = None, ylabel: str = "perplexity",
                title: str = "", log: bool = True) -> Figure:
    """Bars for our measurements, optionally beside published numbers; every bar carries its value."""
    if not values:
        raise ValueError("values must hold at least one bar")
    names = list(values)
    x = np.arange(len(names))
    fig, (ax,) = _axes((max(5.5, 1.2 * len(names)), 4))
    ax.grid(False)
    ax.grid(alpha=0.3, axis="y")
    width = 0.4 if reference else 0.6
    colours = CYCLE.by_key()["color"]
    bars = ax.bar(x - (width / 2 if reference else 0), [values[n] for n in names], width, label="measured here",
                  color=colours[0])
    ax.bar_label(bars, [plain_number(values[n]) for n in names], fontsize=8, padding=2)
    if reference:
        ref = ax.bar(x + width / 2, [reference.get(n, np.nan) for n in names], width, label="paper",
                     color=colours[1], hatch="//", edgecolor="white")
        ax.bar_label(ref, [plain_number(reference[n]) if n in reference else "" for n in names], fontsize=8, padding=2)
        ax.legend(loc="upper left")
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set(ylabel=ylabel, yscale="log" if log else "linear")
    top = max(v for v in list(values.values()) + list((reference or {}).values()) if np.isfinite(v))
    low = min(v for v in list(values.values()) + list((reference or {}).values()) if np.isfinite(v))
    # log bars grow from 1 (or below the smallest value), so their heights compare like the values' logs
    ax.set_ylim(min(1.0, low / 1.5) if log else None, top * (2.5 if log else 1.15))
    plain_ticks(ax, "y")
    lo, hi = min(values, key=values.get), max(values, key=values.get)
    finding = f"{hi}: {values[hi] / values[lo]:.1f}x {lo}" if values[lo] > 0 and lo != hi else ""
    ax.set_title(f"{title}\n{finding}" if title and finding else title or finding, fontsize=10)
    fig.tight_layout()
    return fig


def lines_plot(x: Sequence[float], series: dict[str, Sequence[float]], xlabel: str, ylabel: str, title: str = "",
               logy: bool = False, logx: bool = False) -> Figure:
    """Several y series over one x axis (each series one value per x); plain tick numbers on log axes too."""
    if not series or not len(x):
        raise ValueError("lines_plot needs at least one series and one x value")
    for name, ys in series.items():
        if len(ys) != len(x):
            raise ValueError(f"series {name!r} has {len(ys)} values for {len(x)} x values")
    fig, (ax,) = _axes((7, 4))
    dense = len(x) > 40  # markers only where they can be told apart
    for name, ys in series.items():
        ax.plot(x, ys, label=name, **({"marker": "none"} if dense else {}))
    ax.set(xlabel=xlabel, ylabel=ylabel, yscale="log" if logy else "linear", xscale="log" if logx else "linear")
    if dense:
        ax.set_xlim(min(x), max(x))
    else:
        ax.margins(x=0.04)
    ax.set_title(title, fontsize=10)
    plain_ticks(ax)
    ax.legend(loc="best")
    fig.tight_layout()
    return fig


def spread_plot(series: dict[str, Sequence[float]], xlabel: str, title: str = "", reference: float | None = None,
                logx: bool = False) -> Figure:
    """How results vary over passages (or seeds): one row per series, one dot per passage, a bar at the median.

    series: name -> values (one per passage); reference: a vertical line (e.g. 1.0 for ratios)."""
    names = list(series)
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(names) + 1.6))
    for row, name in enumerate(names):
        values = np.asarray(series[name], dtype=float)
        jitter = np.linspace(-0.12, 0.12, len(values)) if len(values) > 1 else np.zeros(1)
        ax.scatter(values, row + jitter, s=22, alpha=0.75, color=f"C{row % 10}", zorder=3)
        ax.plot([np.median(values)] * 2, [row - 0.3, row + 0.3], color="black", lw=2, zorder=4)
    if reference is not None:
        ax.axvline(reference, color="grey", ls="--", lw=1)
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set(xlabel=xlabel, title=title, xscale="log" if logx else "linear")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


__all__ += ["spread_plot"]


def frontier_plot(points: Sequence, reference, title: str = "") -> Figure:
    """Quality against bytes: one line per family of stores, one marker per store (``course.frontier.StorePoint``:
    x its fraction of the full cache's bytes, y the median over the passages of its perplexity / ``reference``'s on
    the same passage, a paired ratio). The bar is the interval of those paired ratios (``course.stats.interval``: the
    order-statistic interval of the median, the range of up to 8 passages): pairing is real here, every store reads
    the same passages and computes deterministically."""
    if not points:
        raise ValueError("frontier_plot needs at least one point")
    fig, (ax,) = _axes((7.5, 4.5))
    families = list(dict.fromkeys(p.family for p in points))
    for i, family in enumerate(families):
        members = sorted((p for p in points if p.family == family), key=lambda p: p.bytes_fraction)
        x = [p.bytes_fraction for p in members]
        spans = [interval(p.ratio_to(reference).values) for p in members]
        y = [s.point for s in spans]
        ax.errorbar(x, y, yerr=[[s.point - s.low for s in spans], [s.high - s.point for s in spans]], marker="o",
                    capsize=3, color=f"C{i % 10}", label=family)
        for p, xi, yi in zip(members, x, y):
            ax.annotate(p.label, (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7, color=f"C{i % 10}")
    ax.axhline(1.0, color="grey", ls="--", lw=1)
    ax.set(xlabel="bytes held / the full cache's (16-bit)", ylabel="perplexity / the full cache's, paired by passage",
           xscale="log")
    ax.set_title(title, fontsize=10)
    plain_ticks(ax)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


__all__ += ["frontier_plot"]


# --- figures for the interactive explorers

__all__ += ["kept_tokens_figure"]

KEPT_COLOUR, EVICTED_COLOUR = "#b7e4c7", "#f5c6c6"  # cached / evicted tokens, also in course.widgets


def _token_layout(tokens: Sequence[str], cols: int) -> list[tuple[int, int, int, str]]:
    """Place tokens as running text in lines of ``cols`` characters.

    Returns one (token index, column, line, text) per piece; a newline inside a token shows as
    "↵" and ends the line, and a token that does not fit on the current line starts the next.
    """
    if cols < 8:
        raise ValueError(f"cols must be >= 8, got {cols}")
    pieces, x, y = [], 0, 0
    for i, tok in enumerate(tokens):
        parts = tok.replace("\t", " ").split("\n")
        for j, part in enumerate(parts):
            text = part + ("↵" if j < len(parts) - 1 else "")
            if x > 0 and x + len(text) > cols:
                x, y = 0, y + 1
            if text:
                pieces.append((i, x, y, text))
                x += len(text)
            if j < len(parts) - 1:
                x, y = 0, y + 1
    return pieces


def kept_tokens_figure(tokens: Sequence[str], kept: Sequence[bool | None], title: str = "",
                       cols: int = 96, fontsize: float = 9.0) -> Figure:
    """The text with every token coloured by what the cache did with it.

    ``kept[i]``: True (still cached, green), False (evicted, red) or None (never cached, e.g. the
    last token of a stream, which is only predicted: no colour). Same length as ``tokens``.
    """
    if len(kept) != len(tokens):
        raise ValueError(f"kept must have one entry per token ({len(tokens)}), got {len(kept)}")
    pieces = _token_layout(tokens, cols)
    lines = 1 + max((y for _, _, y, _ in pieces), default=0)
    char_w, line_h = 0.602 * fontsize / 72, 1.6 * fontsize / 72  # inches (DejaVu Sans Mono advance)
    margin, head = 0.15, 0.75  # inches; the head holds the title and the legend
    width, height = cols * char_w, lines * line_h
    fig = plt.figure(figsize=(width + 2 * margin, height + head + margin))
    ax = fig.add_axes((margin / fig.get_figwidth(), margin / fig.get_figheight(),
                       width / fig.get_figwidth(), height / fig.get_figheight()))
    ax.set(xlim=(0, cols), ylim=(lines, 0))
    ax.axis("off")
    colour = {True: KEPT_COLOUR, False: EVICTED_COLOUR}
    for i, x, y, text in pieces:
        if kept[i] is not None:
            ax.add_patch(plt.Rectangle((x, y + 0.08), len(text), 0.84, color=colour[bool(kept[i])], lw=0))
        ax.text(x, y + 0.5, text, family="DejaVu Sans Mono", fontsize=fontsize, va="center", ha="left",
                color="black" if kept[i] is not False else "#777777")
    handles = [plt.Rectangle((0, 0), 1, 1, color=KEPT_COLOUR), plt.Rectangle((0, 0), 1, 1, color=EVICTED_COLOUR)]
    n_kept, n_evicted = sum(k is True for k in kept), sum(k is False for k in kept)
    left, top = margin / fig.get_figwidth(), 1 - 0.1 / fig.get_figheight()
    fig.text(left, top, title, ha="left", va="top", fontsize=10)
    fig.legend(handles, [f"cached ({n_kept})", f"evicted ({n_evicted})"], loc="upper left", ncol=2, fontsize=8,
               frameon=False, bbox_to_anchor=(left, 1 - 0.32 / fig.get_figheight()), borderaxespad=0)
    return fig
