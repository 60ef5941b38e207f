"""The figures of notebook 09, one number per head or per method: a layer x head map, accuracies with their
intervals, and the memory/accuracy frontier of head-wise budgets. Drawn in the course's style (``course.plots``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from matplotlib.figure import Figure

from course.plots import _axes, _legend_below, plain_ticks
from course.stats import proportion_interval

__all__ = ["head_map", "accuracy_bars", "head_frontier"]


def head_map(scores: torch.Tensor, title: str = "", label: str = "retrieval score") -> Figure:
    """One cell per (layer, head): scores [L, H] as a heat map, layers down, heads across."""
    if scores.dim() != 2:
        raise ValueError(f"scores must be [layers, heads], got shape {tuple(scores.shape)}")
    fig, (ax,) = _axes((7.5, 4.2))
    image = ax.imshow(scores.float().cpu().numpy(), aspect="auto", cmap="viridis", vmin=0,
                      vmax=max(float(scores.max()), 1e-6), interpolation="nearest")
    fig.colorbar(image, ax=ax, label=label)
    ax.set(xlabel="head", ylabel="layer")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def accuracy_bars(right: Mapping[str, tuple[int, int]], title: str = "", ylabel: str = "passkey accuracy") -> Figure:
    """One bar per condition: ``right`` maps a name to (prompts answered, prompts); the bar is the share, the
    whisker its Wilson 95 % interval (``course.stats.proportion_interval``)."""
    if not right:
        raise ValueError("accuracy_bars needs at least one condition")
    names = list(right)
    shares = [k / n for k, n in right.values()]
    bounds = [proportion_interval(k, n) for k, n in right.values()]
    fig, (ax,) = _axes((7.5, 3.6))
    ax.bar(range(len(names)), shares, color=[f"C{i % 10}" for i in range(len(names))])
    ax.errorbar(range(len(names)), shares, fmt="none", ecolor="black", capsize=4,
                yerr=[[s - lo for s, (lo, _) in zip(shares, bounds)], [hi - s for s, (_, hi) in zip(shares, bounds)]])
    ax.set_xticks(range(len(names)), names, rotation=15, ha="right", fontsize=8)
    ax.set(ylabel=ylabel, ylim=(0, 1.05), xlabel="condition")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def head_frontier(points: Sequence[Mapping], title: str = "") -> Figure:
    """Two panels against the bytes held (a fraction of the full cache's): passkey accuracy (Wilson 95 %
    whiskers) and perplexity over the full cache's, one line per method. A point: {"method", "bytes",
    "right", "trials", "ppl_ratio"}."""
    if not points:
        raise ValueError("head_frontier needs at least one point")
    fig, axes = _axes((11, 4.2), ncols=2)
    methods = list(dict.fromkeys(p["method"] for p in points))
    styles = ("-", "--", "-.", ":")
    for i, method in enumerate(methods):
        members = sorted((p for p in points if p["method"] == method), key=lambda p: p["bytes"])
        x = np.array([p["bytes"] for p in members])
        acc = np.array([p["right"] / p["trials"] for p in members])
        lo_hi = np.array([proportion_interval(p["right"], p["trials"]) for p in members])
        style = dict(marker="o", color=f"C{i % 10}", ls=styles[i % len(styles)], label=method)
        axes[0].errorbar(x, acc, yerr=[acc - lo_hi[:, 0], lo_hi[:, 1] - acc], capsize=3, **style)
        axes[1].plot(x, [p["ppl_ratio"] for p in members], **style)
    least = min(p["bytes"] for p in points)
    smallest = [p for p in points if p["bytes"] == least]
    best = max(smallest, key=lambda p: p["right"] / p["trials"])
    closest = min(smallest, key=lambda p: p["ppl_ratio"])
    axes[0].set_title(f"passkey, fewest bytes: {best['method']} best ({best['right']}/{best['trials']})", fontsize=9)
    axes[1].set_title(f"perplexity, fewest bytes: {closest['method']} closest (x{closest['ppl_ratio']:.2f})",
                      fontsize=9)
    axes[0].set(xlabel="bytes held / the full cache's", ylabel="passkey accuracy", ylim=(0, 1.05))
    axes[1].set(xlabel="bytes held / the full cache's", ylabel="perplexity / the full cache's")
    axes[1].axhline(1.0, color="grey", ls="--", lw=1)
    for ax in axes:
        plain_ticks(ax, "x")
    fig.suptitle(title, fontsize=10)
    _legend_below(axes[1], len(methods))
    fig.tight_layout()
    return fig
