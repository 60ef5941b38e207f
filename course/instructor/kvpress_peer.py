"""The independent peer of the head-wise caches (``course.headwise``): NVIDIA's kvpress 0.5.5.

The same weights (SmolLM2-135M through transformers) and the same passkey prompts go through kvpress's
``AdaKVPress(SnapKVPress)``, ``PyramidKVPress`` and ``DuoAttentionPress``; the positions each keeps per layer and KV
head are read back and compared with the course's ``ada_kv``, ``pyramid_kv`` and ``duo_attention`` plans
(tests/instructor/test_kvpress_peer.py).

How kvpress runs here (adaptations around it; none touches how it chooses):

* it is installed without its dependencies (scripts/setup.sh): it pins ``transformers<5.3`` and the course runs
  5.25. Its top-level import reaches ``datasets`` (DuoAttention's on-the-fly head scoring and a statistics press,
  neither ever called here): a stand-in module named ``datasets`` sits in ``sys.modules`` during that import only.
* transformers 5.25 hands attention its cache as ``cache`` (kvpress reads ``past_key_values``) and no
  ``cache_position`` (kvpress's test for the prefill): ``press_hooks`` renames the first, takes the second from
  ``position_ids`` and calls the press's own ``forward_hook``.
* ``DuoAttentionPress`` downloads its head pattern from the DuoAttention repository in ``post_init_from_model``;
  the peer sets ``streaming_mask``, ``sink_size`` and ``recent_size`` itself and never calls it.

How the kept positions are read: SnapKV and PyramidKV remove keys; the kept positions are found by matching the
compressed keys to those of a plain prefill (every key vector is distinct: the rotary embedding makes equal tokens
differ by position). AdaKV and DuoAttention keep every key and hide some while decoding
(``module.masked_key_indices``, kvpress/attention_patch.py): what they keep is what they do not hide.
"""

from __future__ import annotations

import contextlib
import math
import sys
import types
from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = ["KVPRESS", "import_kvpress", "compression_ratio", "snapkv_press", "ada_kv_press", "pyramid_kv_press",
           "duo_attention_press", "kept_by_press", "kvpress_adakv_keep", "kvpress_layer_budgets", "agreement"]

KVPRESS = "kvpress==0.5.5"  # the version this peer reads (scripts/setup.sh installs it)


def _no_datasets(*args, **kwargs):
    raise RuntimeError("the kvpress peer has no `datasets`: kvpress's on-the-fly scoring is not used here")


def import_kvpress() -> types.ModuleType:
    """kvpress, imported with the stand-in ``datasets`` (module doc); a clear error when it is not installed."""
    stand_in = "datasets" not in sys.modules
    if stand_in:
        sys.modules["datasets"] = types.ModuleType("datasets")
        sys.modules["datasets"].load_dataset = _no_datasets  # type: ignore[attr-defined]
    try:
        import kvpress
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"the kvpress peer needs {KVPRESS} ({e}): run scripts/setup.sh, which installs it "
                                  "without its dependencies") from e
    finally:
        if stand_in:  # the course's own online path imports the real `datasets` (course.data)
            del sys.modules["datasets"]
    return kvpress


def compression_ratio(budget: int, prompt_tokens: int) -> float:
    """kvpress's ``compression_ratio`` that keeps exactly ``budget`` of ``prompt_tokens`` slots per head
    (its ``compute_n_kept`` truncates ``k_len * (1 - ratio)``: the ratio is nudged down past float error)."""
    if not 1 <= budget < prompt_tokens:
        raise ValueError(f"budget must be in 1..{prompt_tokens - 1} (prompt_tokens - 1), got {budget}")
    compute_n_kept = import_kvpress().utils.compute_n_kept

    ratio = (prompt_tokens - budget) / prompt_tokens
    while compute_n_kept(prompt_tokens, ratio) < budget:
        ratio = math.nextafter(ratio, -math.inf)
    return ratio


def snapkv_press(budget: int, prompt_tokens: int, *, window: int = 8, kernel: int = 5):
    """kvpress's SnapKV keeping ``budget`` slots per KV head of a ``prompt_tokens`` prompt."""
    kv = import_kvpress()
    return kv.SnapKVPress(compression_ratio(budget, prompt_tokens), window_size=window, kernel_size=kernel)


def ada_kv_press(budget: int, prompt_tokens: int, *, safeguard: float = 0.2, window: int = 8, kernel: int = 5):
    """kvpress's AdaKV over SnapKV scores: ``budget`` slots per KV head on average over a layer."""
    kv = import_kvpress()
    return kv.AdaKVPress(snapkv_press(budget, prompt_tokens, window=window, kernel=kernel), alpha_safeguard=safeguard)


def pyramid_kv_press(budget: int, prompt_tokens: int, *, window: int = 8, kernel: int = 5, beta: int = 20):
    """kvpress's PyramidKV: ``budget`` slots per KV head on average over the layers, fewer with depth."""
    kv = import_kvpress()
    return kv.PyramidKVPress(compression_ratio(budget, prompt_tokens), window_size=window, kernel_size=kernel,
                             beta=beta)


def duo_attention_press(retrieval: Tensor, sinks: int, recent: int):
    """kvpress's DuoAttention with a given head pattern: ``retrieval`` [L, H_kv] bool (True: the whole cache), the
    other heads ``sinks`` first and ``recent`` last positions of the prompt."""
    if retrieval.dtype != torch.bool or retrieval.dim() != 2:
        raise ValueError(f"retrieval must be a [layers, kv_heads] bool tensor, got {retrieval.dtype} "
                         f"{tuple(retrieval.shape)}")
    if sinks < 0 or recent < 1:
        raise ValueError(f"sinks must be >= 0 and recent >= 1 (kvpress slices [sinks:-recent]), got {sinks}, {recent}")
    press = import_kvpress().DuoAttentionPress(head_compression_ratio=float((~retrieval).float().mean()))
    press.streaming_mask, press.sink_size, press.recent_size = ~retrieval, sinks, recent
    return press


@contextlib.contextmanager
def press_hooks(hf, press) -> Iterator[None]:
    """``press`` applied to the prefill of ``hf`` (a transformers Llama-family model): kvpress's ``__call__`` minus
    ``post_init_from_model``, with the attention arguments renamed for transformers 5.25 (module doc)."""
    def hook(module, args, kwargs, output):
        seen = {"past_key_values": kwargs["cache"], "cache_position": kwargs["position_ids"][0]}
        return press.forward_hook(module, args, kwargs | seen, output)

    handles = [layer.self_attn.register_forward_hook(hook, with_kwargs=True) for layer in hf.model.layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.inference_mode()
def _prefill(hf, ids: Tensor, press) -> tuple[list[Tensor], list[tuple | None]]:
    """Each layer's cached keys [H_kv, S, d] (batch row 0) after a prefill of ``ids`` [1, P], and the keys the press
    hides while decoding (None: none), read and then cleared from the attention modules."""
    from transformers import DynamicCache

    cache = DynamicCache(config=hf.config)
    with press_hooks(hf, press) if press is not None else contextlib.nullcontext():
        hf(ids, cache=cache, use_cache=True)
    hidden = []
    for layer in hf.model.layers:
        hidden.append(getattr(layer.self_attn, "masked_key_indices", None))
        layer.self_attn.masked_key_indices = None  # the next prefill starts clean
    return [layer.keys[0] for layer in cache.layers], hidden


def kept_by_press(hf, ids: Tensor, press) -> list[list[Tensor]]:
    """Positions (sorted, long) each KV head of each layer keeps after ``press`` compresses the prompt ``ids``
    [1, P]: ``[layer][kv_head]``, read as the module doc says. ``hf`` must run sdpa attention (kvpress's AdaKV
    and DuoAttention refuse eager)."""
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"ids must be one prompt [1, P], got shape {tuple(ids.shape)}")
    full, _ = _prefill(hf, ids, None)
    kept, hidden = _prefill(hf, ids, press)
    out = []
    for full_keys, kept_keys, masked in zip(full, kept, hidden):
        keep = (kept_keys[:, :, None, :] == full_keys[:, None, :, :]).all(-1).any(1)  # [H_kv, S]
        if not bool((keep.sum(-1) == kept_keys.shape[1]).all()):
            raise RuntimeError("a compressed key matches no key of the plain prefill (or several)")
        if masked is not None:
            batch, head, slot = masked
            keep[head[batch == 0], slot[batch == 0]] = False
        out.append([row.nonzero()[:, 0] for row in keep])
    return out


def kvpress_adakv_keep(scores: Tensor, budget: int, safeguard: float) -> Tensor:
    """kvpress's AdaKV allocation on given scores [B, H_kv, S] (its ``compress`` with a press that returns them):
    which slots it keeps, bool [B, H_kv, S]."""
    kv = import_kvpress()

    class GivenScores(kv.ScorerPress):
        def score(self, *args, **kwargs) -> Tensor:
            return scores.clone()

    press = kv.AdaKVPress(GivenScores(compression_ratio(budget, scores.shape[-1])), alpha_safeguard=safeguard)
    module = types.SimpleNamespace(config=types.SimpleNamespace(_attn_implementation="sdpa"))
    keys = scores.new_zeros(*scores.shape, 1)
    press.compress(module, None, keys, keys, None, {})
    keep = torch.ones_like(scores, dtype=torch.bool)
    keep[module.masked_key_indices] = False
    return keep


def kvpress_layer_budgets(n_layers: int, budget: int, prompt_tokens: int, *, window: int = 8,
                          beta: int = 20) -> list[int]:
    """PyramidKVPress's slots per KV head in each layer for a ``prompt_tokens`` prompt (``get_layer_budget``)."""
    press = pyramid_kv_press(budget, prompt_tokens, window=window, beta=beta)
    config = types.SimpleNamespace(num_hidden_layers=n_layers)
    return [press.get_layer_budget(types.SimpleNamespace(config=config, layer_idx=i), prompt_tokens)
            for i in range(n_layers)]


def agreement(ours: list[list[Tensor]], theirs: list[list[Tensor]]) -> dict:
    """How alike two sets of kept positions are, ``[layer][kv_head]`` each: the mean and the least over heads of
    |both| / max(|ours|, |theirs|), the share of heads that keep the very same positions, and the slots each keeps."""
    if len(ours) != len(theirs) or any(len(a) != len(b) for a, b in zip(ours, theirs)):
        raise ValueError("ours and theirs must have the same layers and heads")
    shares, same = [], 0
    for a_layer, b_layer in zip(ours, theirs):
        for a, b in zip(a_layer, b_layer):
            both = int(torch.isin(a.cpu(), b.cpu()).sum())
            shares.append(both / max(len(a), len(b), 1))
            same += int(torch.equal(a.cpu().sort().values, b.cpu().sort().values))
    return {"mean": sum(shares) / len(shares), "min": min(shares), "identical_heads": same / len(shares),
            "slots": (sum(len(a) for row in ours for a in row), sum(len(b) for row in theirs for b in row))}
