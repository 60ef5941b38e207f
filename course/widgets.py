"""Interactive explorers for the notebooks: attention maps head by head, and what a cache policy keeps.

The widgets are thin. Every callback calls a plain function of this module that returns what to
show (``attention_view``, ``cache_view``), so the same numbers can be computed, tested and plotted
without a browser. In a notebook, show a static figure first (``plots.attention_heatmap``,
``CacheView.figure``): an executed notebook keeps figures, while a widget needs a live kernel.

The cache explorer offers the policies of the table (``course.policies.POLICIES``) shown in ``explorer`` and
builds them with ``course.policies.make_policy``; the built-in ones:

=========  ====================================  =======================================
policy     budget (slots per KV head)            sinks
=========  ====================================  =======================================
window     the window                            not used (a window with sinks is StreamingLLM)
streaming  sinks + the recent window             1..8 first tokens pinned
h2o        half heavy hitters, half recent       0..8 first tokens pinned on top
snapkv     capacity kept after the prompt        0..8 first tokens pinned on top
=========  ====================================  =======================================

Policies that evict while decoding run the text as a stream through the course's cache; the
explorer shows the cache after the last prediction (the last token is only predicted, never
cached). SnapKV compresses a prompt once and never evicts while decoding: the whole text is
its prompt (it runs with full attention, so its perplexity is the full cache's), and the
explorer shows what the compressed cache keeps for the tokens that would follow.
"""

from __future__ import annotations

import html
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import Tensor

from course import plots
from course.attention_analysis import sink_mass, uniform_mass
from course.compression import compress_prompt
from course.kvcache import KVCache
from course.models.base import CausalLM
from course.policies import POLICIES, Policy, make_policy, policy_names
from course.streaming import evaluate_stream, next_token_nll

__all__ = [
    "token_strings", "head_sink_mass", "attention_view", "attention_explorer",
    "sinks_range", "explorer_policy", "CacheRun", "run_policy", "CacheView", "kept_tokens_html", "cache_view",
    "cache_explorer", "ExplorerBox",
]

SINK_SKIP = 4  # queries before this position are left out of the sink mass (see course.attention_analysis.sink_mass)
MAX_SINKS = 8
MIN_BUDGET = 16  # the smallest budget the cache explorer offers (above MAX_SINKS, so every policy is valid)
DEFAULT_BUDGET = 64


class ExplorerBox(widgets.VBox):
    """The widgets of one explorer. Where there is no kernel to run them (an executed notebook saved
    by papermill or nbval, its HTML, GitHub), the page shows one line saying so instead of the
    ``VBox(children=...)`` text of the widgets; a live front end shows the widgets as usual."""

    def __init__(self, children: Sequence[widgets.Widget], name: str) -> None:
        super().__init__(list(children))
        self.explorer_name = name

    def __repr__(self) -> str:
        return (f"[{self.explorer_name}: interactive, it needs a live Jupyter kernel; run this cell in "
                "JupyterLab to use it. The figure above is a static view.]")

    def _repr_mimebundle_(self, **kwargs) -> dict | None:
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            bundle["text/plain"] = repr(self)  # the whole line (ipywidgets shortens reprs to 110 characters)
        return bundle


def _check_index(name: str, value: int, size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise ValueError(f"{name} must be an integer between 0 and {size - 1}, got {value!r}")
    return value


def _one_stream(ids: Tensor) -> Tensor:
    """ids [T] or [1, T] -> [1, T] (at least 2 tokens)."""
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(f"ids must be one stream, [tokens] or [1, tokens] with >= 2 tokens, got {tuple(ids.shape)}")
    return ids


def _png(fig: Figure) -> bytes:
    """Render a figure to PNG bytes and close it (so that it is not shown a second time)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def token_strings(tokenizer, ids: Tensor) -> list[str]:
    """The text of every token of one stream ([T] or [1, T]), decoded one token at a time."""
    return [tokenizer.decode([i]) for i in _one_stream(ids)[0].tolist()]


# ----------------------------------------------------------------------------- attention explorer
def _check_maps(maps: Sequence[Tensor], tokens: Sequence[str]) -> None:
    if not maps:
        raise ValueError("maps is empty: give the per-layer attention maps of course.attention_analysis.attention_maps")
    shape = tuple(maps[0].shape)
    if len(shape) != 4 or shape[0] != 1 or shape[2] != shape[3]:
        raise ValueError(f"maps must be per-layer [1, heads, T, T] tensors, got a layer of shape {shape}")
    if len(tokens) != shape[2]:
        raise ValueError(f"tokens must have one string per query of the maps ({shape[2]}), got {len(tokens)}")


def head_sink_mass(maps: Sequence[Tensor], layer: int, head: int) -> float:
    """Mean attention mass one head puts on token 0, over queries from position 4 on.

    maps: per-layer [1, H, T, T] attention weights (``course.attention_analysis.attention_maps``)."""
    _check_index("layer", layer, len(maps))
    _check_index("head", head, maps[layer].shape[1])
    return float(sink_mass([maps[layer]], k=1, skip=SINK_SKIP)[0, head])


def attention_view(maps: Sequence[Tensor], tokens: Sequence[str], layer: int, head: int,
                   max_tokens: int = 64) -> tuple[Figure, str]:
    """What the attention explorer shows for one (layer, head): its heat map (the first
    ``max_tokens`` queries and keys) and a sentence with its sink mass.

    maps: per-layer [1, H, T, T]; tokens: T strings."""
    _check_maps(maps, tokens)
    mass = head_sink_mass(maps, layer, head)
    t = len(tokens)
    fig = plots.attention_heatmap(maps[layer][0, head], tokens, title=f"layer {layer}, head {head}",
                                  max_tokens=max_tokens)
    text = (f"layer {layer}, head {head}: sink mass {mass:.3f} (share of attention on token 0, queries "
            f"{SINK_SKIP}..{t - 1}; uniform attention would give {uniform_mass(t, 1, SINK_SKIP):.3f})")
    return fig, text


def attention_explorer(maps: Sequence[Tensor], tokens: Sequence[str], max_tokens: int = 64) -> ExplorerBox:
    """Layer and head sliders over ``attention_view``: the heat map and the sink mass of each head.

    maps: per-layer [1, H, T, T] attention weights (``course.attention_analysis.attention_maps``); tokens: T strings."""
    _check_maps(maps, tokens)
    layer = widgets.IntSlider(0, min=0, max=len(maps) - 1, description="layer", continuous_update=False)
    head = widgets.IntSlider(0, min=0, max=maps[0].shape[1] - 1, description="head", continuous_update=False)
    image = widgets.Image(format="png", layout=widgets.Layout(align_self="flex-start"))  # natural size
    caption = widgets.HTML()

    def show(_=None) -> None:
        fig, text = attention_view(maps, tokens, layer.value, head.value, max_tokens)
        image.value, caption.value = _png(fig), html.escape(text)

    layer.observe(show, "value")
    head.observe(show, "value")
    show()
    return ExplorerBox([widgets.HBox([layer, head]), caption, image], "attention explorer")


# ----------------------------------------------------------------------------- cache explorer
def sinks_range(policy_name: str) -> tuple[int, int] | None:
    """The sinks the cache explorer allows for a policy (inclusive), or None when it takes none."""
    kind = POLICIES.get(policy_name)  # an unknown name: make_policy names the known ones
    if kind is not None and not kind.explorer_sinks:
        return None
    return (1 if kind is not None and kind.sinks else 0), MAX_SINKS


def explorer_policy(policy_name: str, budget: int, sinks: int, model=None) -> Policy:
    """The policy behind one setting of the cache explorer (see the table in the module docstring),
    built by ``make_policy`` for ``model`` (a model or its config: it picks the position rule)."""
    allowed = sinks_range(policy_name)
    if allowed is None and sinks != 0:
        raise ValueError(f"sinks must be 0 for {policy_name!r} (the explorer pins no sinks with it), got {sinks}")
    if allowed is not None and not allowed[0] <= sinks <= allowed[1]:
        raise ValueError(f"sinks must be between {allowed[0]} and {allowed[1]} for {policy_name!r}, got {sinks}")
    return make_policy(policy_name, budget, sinks=sinks, model=model)


@dataclass(frozen=True)
class CacheRun:
    """One policy on one text: its perplexity and what its cache holds at the end.

    positions: [layers, H_kv, S] original positions of the cached tokens (sorted);
    protocol: "stream" (decoded token by token, evicting) or "prompt" (compressed once).
    """

    label: str
    ppl: float
    ppl_after_fill: float | None
    positions: Tensor
    n_tokens: int
    protocol: str
    static: bool  # decided by positions alone: every layer and head keeps the same tokens


def _final_positions(cache: KVCache) -> dict:
    """``inspect=`` hook: the cached positions of every layer, [layers, H_kv, S] (batch row 0)."""
    return {"positions": torch.stack([cache.positions(i)[0] for i in range(len(cache.layers))]).cpu()}


def _sorted(positions: Tensor) -> Tensor:
    return positions.sort(dim=-1).values


def _static_positions(model: CausalLM, policy: Policy, n_tokens: int) -> Tensor:
    """What a position-only policy caches after token n_tokens - 2 (the last one decoded): [L, H_kv, S]."""
    keys = torch.arange(n_tokens - 1)
    kept = keys[policy.visible(torch.tensor(n_tokens - 2), keys)]
    return kept.expand(model.config.n_layer, model.config.n_kv_head, -1)


@torch.inference_mode()
def _prompt_run(model: CausalLM, ids: Tensor, policy: Policy) -> CacheRun:
    """Compress-once policies: the text but its last token is the prompt (full attention), then compressed."""
    cache, logits = compress_prompt(model, ids[:, :-1], policy)
    nll = next_token_nll(logits, ids[:, 1:].to(model.device))  # as the stream evaluators compute it
    ppl = math.exp(nll.double().mean().item())
    positions = _sorted(_final_positions(cache)["positions"])
    return CacheRun(policy.label, ppl, None, positions, ids.shape[1], "prompt", False)


def run_policy(model: CausalLM, ids: Tensor, policy: Policy) -> CacheRun:
    """Run one stream ([T] or [1, T]) under ``policy``: the perplexity ``evaluate_stream`` reports and
    the cached positions at the end. Position-only policies use the fast exact evaluator; the others
    decode token by token through the course's cache. SnapKV-like policies (no budget while
    decoding, a prompt budget) compress the text once instead (see the module docstring)."""
    ids = _one_stream(ids)
    n = ids.shape[1]
    if policy.budget is None and policy.prompt_budget is not None:
        return _prompt_run(model, ids, policy)
    if policy.is_static:
        result = evaluate_stream(model, ids, policy, progress=False)
        positions = _static_positions(model, policy, n)
    else:
        result = evaluate_stream(model, ids, policy, progress=False, inspect=_final_positions)
        positions = _sorted(result.extra["positions"])
    return CacheRun(policy.label, result.ppl(), result.ppl_after_fill, positions, n, "stream", policy.is_static)


def _token_html(token: str) -> str:
    """A token as HTML text; a newline shows as "↵" before the line break."""
    return html.escape(token).replace("\n", "↵\n")


def kept_tokens_html(tokens: Sequence[str], kept: Sequence[bool | None]) -> str:
    """The text as HTML, every token coloured like ``plots.kept_tokens_figure``: cached (green),
    evicted (red, grey text), never cached (None: plain). Hover a token for its position."""
    if len(kept) != len(tokens):
        raise ValueError(f"kept must have one entry per token ({len(tokens)}), got {len(kept)}")
    style = {True: f"background:{plots.KEPT_COLOUR}", False: f"background:{plots.EVICTED_COLOUR};color:#777",
             None: ""}
    spans = "".join(f'<span style="{style[k]}" title="token {i}">{_token_html(tok)}</span>'
                    for i, (tok, k) in enumerate(zip(tokens, kept)))
    return f'<div style="font-family:monospace;white-space:pre-wrap;line-height:1.7;color:black">{spans}</div>'


@dataclass(frozen=True)
class CacheView:
    """What the cache explorer shows for one setting: the text, which tokens are cached, the perplexity."""

    run: CacheRun
    tokens: list[str]
    layer: int
    kv_head: int

    @property
    def kept(self) -> frozenset[int]:
        """Original positions cached in this (layer, KV head) at the end."""
        return frozenset(self.run.positions[self.layer, self.kv_head].tolist())

    @property
    def ppl(self) -> float:
        return self.run.ppl

    @property
    def mask(self) -> list[bool | None]:
        """Per token: cached (True), evicted (False) or never cached (None: the last token of a stream)."""
        kept, n = self.kept, len(self.tokens)
        return [i in kept if i < n - 1 else None for i in range(n)]

    @property
    def summary(self) -> str:
        run = self.run
        after = f", {run.ppl_after_fill:.2f} once the cache is full" if run.ppl_after_fill is not None else ""
        if run.protocol == "prompt":
            after = " (the whole text is the prompt, read with full attention, then compressed)"
        where = ("every layer and head" if run.static else f"layer {self.layer}, KV head {self.kv_head}")
        return f"{run.label}: PPL {run.ppl:.2f}{after}; {len(self.kept)} of {run.n_tokens} tokens cached ({where})"

    @property
    def html(self) -> str:
        return kept_tokens_html(self.tokens, self.mask)

    def figure(self, cols: int = 96) -> Figure:
        """The static version of the view (``plots.kept_tokens_figure``)."""
        return plots.kept_tokens_figure(self.tokens, self.mask, title=self.summary, cols=cols)


def cache_view(model: CausalLM, tokenizer, ids: Tensor, policy_name: str, budget: int, sinks: int,
               layer: int = 0, kv_head: int = 0, memo: dict | None = None) -> CacheView:
    """One setting of the cache explorer: run ``explorer_policy(policy_name, budget, sinks)`` on the
    stream ``ids`` ([T] or [1, T]) and look at the cache of one (layer, KV head).

    ``memo`` (optional) keeps the runs of earlier settings for the same model and ids; it is filled in."""
    ids = _one_stream(ids)
    _check_index("layer", layer, model.config.n_layer)
    _check_index("kv_head", kv_head, model.config.n_kv_head)
    key = (policy_name, budget, sinks)
    run = memo.get(key) if memo is not None else None
    if run is None:
        run = run_policy(model, ids, explorer_policy(policy_name, budget, sinks, model))
        if memo is not None:
            memo[key] = run
    return CacheView(run, token_strings(tokenizer, ids), layer, kv_head)


class _CacheExplorer:
    """The controls of ``cache_explorer`` and the one callback that refreshes the view."""

    def __init__(self, model: CausalLM, tokenizer, ids: Tensor, policies: Sequence[str]) -> None:
        self.model, self.tokenizer, self.ids, self.memo = model, tokenizer, ids, {}
        n, cfg = ids.shape[1], model.config
        self.policy = widgets.Dropdown(options=list(policies), value=policies[0], description="policy")
        self.budget = widgets.IntSlider(min(DEFAULT_BUDGET, n - 2), min=MIN_BUDGET, max=n - 2, description="budget",
                                        continuous_update=False)
        self.sinks = widgets.IntSlider(4, min=0, max=MAX_SINKS, description="sinks", continuous_update=False)
        self.layer = widgets.IntSlider(0, min=0, max=cfg.n_layer - 1, description="layer", continuous_update=False)
        self.kv_head = widgets.IntSlider(0, min=0, max=cfg.n_kv_head - 1, description="KV head",
                                         continuous_update=False)
        self.status, self.text = widgets.HTML(), widgets.HTML()
        self.adjusting = False
        self.policy.observe(self.on_policy, "value")
        for w in (self.budget, self.sinks, self.layer, self.kv_head):
            w.observe(self.refresh, "value")
        self.on_policy()

    def on_policy(self, _=None) -> None:
        """Fit the sinks slider to the policy, then refresh once."""
        allowed = sinks_range(self.policy.value)
        self.adjusting = True
        try:
            self.sinks.disabled = allowed is None
            if allowed is not None:
                self.sinks.min, self.sinks.max = allowed
        finally:
            self.adjusting = False
        self.refresh()

    def refresh(self, _=None) -> None:
        if self.adjusting:
            return
        self.status.value = "computing…"
        sinks = 0 if self.sinks.disabled else self.sinks.value
        view = cache_view(self.model, self.tokenizer, self.ids, self.policy.value, self.budget.value, sinks,
                          self.layer.value, self.kv_head.value, memo=self.memo)
        self.status.value = f"<b>{html.escape(view.summary)}</b>"
        self.text.value = view.html

    @property
    def box(self) -> ExplorerBox:
        controls = widgets.VBox([widgets.HBox([self.policy, self.budget, self.sinks]),
                                 widgets.HBox([self.layer, self.kv_head])])
        return ExplorerBox([controls, self.status, self.text], "cache explorer")


def cache_explorer(model: CausalLM, tokenizer, ids: Tensor, policies: Sequence[str] | None = None,
                   max_tokens: int = 192) -> ExplorerBox:
    """A policy dropdown and budget / sinks / layer / KV-head sliders over ``cache_view``: the text
    with the tokens the cache keeps and evicts coloured, and the perplexity. ``policies``: names of the table of
    policies (default: those it shows in ``explorer``).

    ids: one stream [T] or [1, T]; only its first ``max_tokens`` are used: H2O decodes the text
    token by token for every setting, which takes seconds on a CPU for a couple of hundred tokens.
    Every setting is computed once and then remembered."""
    if not MIN_BUDGET + 2 <= max_tokens <= 1024:
        raise ValueError(f"max_tokens must be between {MIN_BUDGET + 2} and 1024, got {max_tokens}")
    policies = policy_names("explorer") if policies is None else policies
    unknown = [name for name in policies if name not in POLICIES]
    if not policies or unknown:
        raise ValueError(f"policies must be a non-empty list of {', '.join(POLICIES)}; got {list(policies)}")
    ids = _one_stream(ids)[:, :max_tokens]
    if ids.shape[1] < MIN_BUDGET + 2:
        raise ValueError(f"ids must hold at least {MIN_BUDGET + 2} tokens for the cache explorer, got {ids.shape[1]}")
    return _CacheExplorer(model, tokenizer, ids, policies).box
