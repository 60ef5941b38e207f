"""Figures for the notebooks: pure matplotlib functions that take numbers and return a Figure."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

__all__ = [
    "cache_size_plot", "decode_cost_plot", "attention_heatmap", "sink_mass_plot", "nll_along_stream",
    "bar_compare", "lines_plot",
]

GIB = 2**30


def cache_size_plot(models: dict[str, int], contexts: Sequence[int], batches: Sequence[int] = (1, 8)) -> Figure:
    """KV-cache size (GiB) vs context length for several models; ``models`` maps name -> bytes per token."""
    fig, axes = plt.subplots(1, len(batches), figsize=(5.5 * len(batches), 4), squeeze=False)
    for ax, batch in zip(axes[0], batches):
        for name, per_token in models.items():
            ax.plot(contexts, [per_token * t * batch / GIB for t in contexts], marker="o", ms=3, label=name)
        ax.set(xscale="log", yscale="log", xlabel="context length (tokens)", ylabel="KV cache (GiB)",
               title=f"batch {batch}")
        ax.axhline(80, color="grey", ls=":", lw=1)
        ax.text(contexts[0], 80 * 1.15, "80 GiB GPU", color="grey", fontsize=8)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def decode_cost_plot(costs: dict) -> Figure:
    """Per-token time with and without a KV cache vs context (from ``decode_cost_vs_context``)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ctx = costs["context"]
    a.plot(ctx, np.array(costs["recompute"]) * 1e3, "o-", label="recompute (no cache)")
    a.plot(ctx, np.array(costs["cached"]) * 1e3, "o-", label="KV cache")
    a.set(xlabel="context length (tokens)", ylabel="ms per new token", title="cost of one more token")
    a.legend()
    ratio = np.array(costs["recompute"]) / np.array(costs["cached"])
    b.plot(ctx, ratio, "o-", color="C2")
    b.set(xlabel="context length (tokens)", ylabel="recompute / cached", title="speed-up of the cache")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def attention_heatmap(weights: torch.Tensor, tokens: Sequence[str] | None = None, title: str = "",
                      ax: plt.Axes | None = None, max_tokens: int = 64) -> Figure:
    """One attention map [T, S] (rows: queries), log-scaled so that small weights stay visible."""
    w = weights[:max_tokens, :max_tokens].float().numpy()
    fig = ax.figure if ax is not None else plt.figure(figsize=(5, 4.5))
    ax = ax or fig.add_subplot()
    im = ax.imshow(np.log10(w + 1e-6), cmap="magma", vmin=-4, vmax=0, interpolation="nearest")
    ax.set(title=title, xlabel="key (attended token)", ylabel="query")
    if tokens is not None and len(tokens) <= 32:
        labels = [repr(t)[1:-1][:8] for t in tokens[: w.shape[0]]]
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
        ax.set_yticks(range(len(labels)), labels, fontsize=6)
    fig.colorbar(im, ax=ax, fraction=0.046, label="log10 weight")
    return fig


def sink_mass_plot(mass: torch.Tensor, uniform: float | None = None, title: str = "") -> Figure:
    """Attention mass on the first token(s): heat map [layers x heads] and the per-layer mean."""
    m = mass.float().numpy()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1.3, 1]})
    im = a.imshow(m.T, aspect="auto", cmap="viridis", vmin=0, vmax=1, origin="lower")
    a.set(xlabel="layer", ylabel="head", title=title or "attention mass on the sink")
    fig.colorbar(im, ax=a)
    b.bar(range(len(m)), m.mean(1), color="C0")
    if uniform is not None:
        b.axhline(uniform, color="C3", ls="--", label=f"uniform attention ({uniform:.3f})")
        b.legend()
    b.set(xlabel="layer", ylabel="mean mass", ylim=(0, 1), title="per layer (mean over heads)")
    fig.tight_layout()
    return fig


def nll_along_stream(curves: dict[str, np.ndarray], smooth: int = 32, marks: dict[str, int] | None = None,
                     title: str = "", ylabel: str = "NLL (nats, running mean)") -> Figure:
    """Per-token NLL along a stream for several settings, smoothed by a running mean."""
    fig, ax = plt.subplots(figsize=(10, 4))
    for name, nll in curves.items():
        nll = np.asarray(nll, dtype=float)
        k = max(1, min(smooth, len(nll)))
        run = np.convolve(nll, np.ones(k) / k, mode="valid")
        ax.plot(np.arange(k - 1, k - 1 + len(run)), run, label=name, lw=1.3)
    for label, x in (marks or {}).items():
        ax.axvline(x, color="grey", ls="--", lw=1)
        ax.text(x, ax.get_ylim()[1] * 0.95, f" {label}", color="grey", fontsize=8, va="top")
    ax.set(xlabel="token position", ylabel=ylabel, title=title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def bar_compare(values: dict[str, float], reference: dict[str, float] | None = None, ylabel: str = "perplexity",
                title: str = "", log: bool = True) -> Figure:
    """Bars for our measurements, optionally beside published numbers."""
    names = list(values)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(names)), 3.8))
    width = 0.4 if reference else 0.6
    ax.bar(x - (width / 2 if reference else 0), [values[n] for n in names], width, label="measured here")
    if reference:
        ax.bar(x + width / 2, [reference.get(n, np.nan) for n in names], width, label="paper", color="C1")
        ax.legend()
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set(ylabel=ylabel, title=title, yscale="log" if log else "linear")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def lines_plot(x: Sequence[float], series: dict[str, Sequence[float]], xlabel: str, ylabel: str, title: str = "",
               logy: bool = False, logx: bool = False) -> Figure:
    """Several y series over one x axis."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, ys in series.items():
        ax.plot(x, ys, "o-", label=name, ms=4)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title, yscale="log" if logy else "linear",
           xscale="log" if logx else "linear")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
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
