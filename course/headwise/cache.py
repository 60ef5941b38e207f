"""A cache whose heads really hold different lengths (``HeadwiseCache``): per layer, its parts (``Part``: some KV
heads and their policy), each held in its own one-layer ``course.kvcache.KVCache``.

Eviction, rotation of cached keys, stores and the policies' statistics (H2O's sums, SnapKV's votes) are therefore
the course's one cache, per part. What this module adds: a layer's ``update`` stores the new keys of each part's
heads in that part and hands attention one transient padded view (``course.headwise.padding``); ``observe`` hands
each part its query heads' weights over its own slots; ``compress`` compresses each part to its policy's budget, or,
under a plan with an allocator (Ada-KV), the layer's heads to their own counts, each head then in a part of its own.

The bytes are the parts' slots, counted by their stores: ragged, and honest. A layer made of one part that covers
every KV head in order is that part's ``KVCache`` itself (no padding): the uniform plan is exactly ``KVCache``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from course.headwise.padding import padded_view, part_weights
from course.headwise.plan import HeadwisePolicy
from course.kvcache import AttentionView, KVCache
from course.policies import FullCache

__all__ = ["HeadwiseCache", "PaddedLayer"]


@dataclass
class PaddedLayer:
    """A layer's slots as one padded tensor (what ``KVCache.layers`` gives for reading: ``live()``, ``length``).
    keys, values: [B, H_kv, S_max, d]; positions: [B, H_kv, S_max] (-1: padding past a head's slots)."""

    keys: Tensor
    values: Tensor
    positions: Tensor

    @property
    def length(self) -> int:
        return self.keys.shape[2]

    def live(self) -> tuple[Tensor, Tensor, Tensor]:
        return self.keys, self.values, self.positions


class HeadwiseCache:
    """The model's cache under a ``HeadwisePolicy``: what models, ``compress_prompts``, ``generate`` and the
    evaluators use of ``KVCache`` (``update``, ``observe``, ``advance``, ``compress``, ``seen``, ``row_seen``,
    ``n_slots``, ``bytes_at``, ``nbytes``, ``layers`` for reading, ``select_rows``, ``rotate``), plus
    ``slots_per_head`` and ``kept_positions``. Make it with ``model.new_cache(batch, headwise_policy)``.

    Only prompts (``chunks="prompt"``): the exact evaluator's stream chunks rest on one position rule per layer."""

    def __init__(self, policy: HeadwisePolicy, batch: int, head_dim: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", chunks: str = "prompt", max_tokens: int | None = None,
                 rope_theta: float | None = None) -> None:
        if not isinstance(policy, HeadwisePolicy):
            raise TypeError(f"policy must be a HeadwisePolicy, got {type(policy).__name__}")
        if chunks != "prompt":
            raise ValueError(f"a HeadwiseCache runs prompts only (chunks='prompt'), got chunks={chunks!r}: the exact "
                             "evaluator's stream chunks need one position rule per layer")
        plan = policy.plan
        self.policy, self.chunks, self.dtype, self.rope_theta = policy, chunks, dtype, rope_theta
        self.shape = (plan.n_layers, batch, plan.n_kv_heads, head_dim)
        self.seen = 0
        self.start: Tensor | None = None  # (no left-padded batches: kept for the models' and groups' checks)
        self._device = device
        self._max_tokens = max_tokens
        self.parts: list[list[tuple[Tensor, KVCache]]] = [
            [(torch.tensor(part.kv_heads, device=device), self._part_cache(len(part.kv_heads), part.policy))
             for part in parts] for parts in plan.layers]
        self._views: dict[int, list[AttentionView]] = {}

    def _part_cache(self, kv_heads: int, policy, max_tokens: int | None = None) -> KVCache:
        """A one-layer ``KVCache`` for ``kv_heads`` heads under ``policy``."""
        return KVCache(1, self.shape[1], kv_heads, self.shape[3], policy=policy, dtype=self.dtype, device=self._device,
                       chunks="prompt", max_tokens=max_tokens or self._max_tokens, rope_theta=self.rope_theta)

    def _whole(self, layer_idx: int) -> KVCache | None:
        """The layer's one part, when it covers every KV head in order (then it is the layer's cache as it is)."""
        parts = self.parts[layer_idx]
        return parts[0][1] if len(parts) == 1 else None

    # ----------------------------------------------------------------------------- the layer's two calls
    def update(self, layer_idx: int, k: Tensor, v: Tensor, pos: Tensor, mask: bool = True) -> AttentionView:
        """Store the new tokens' K/V (k, v: [B, H_kv, T, d]; pos: [B, T]) in each part; return the view over every
        KV head (``course.headwise.padding.padded_view``; a layer of one part: that part's view)."""
        if k.shape[0] != self.shape[1] or k.shape[1] != self.shape[2] or k.shape[3] != self.shape[3]:
            raise ValueError(f"this cache holds [batch={self.shape[1]}, kv_heads={self.shape[2]}, "
                             f"head_dim={self.shape[3]}] but layer {layer_idx} gave keys of shape {tuple(k.shape)}")
        whole = self._whole(layer_idx)
        if whole is not None:
            view = whole.update(0, k, v, pos, mask)
            self._views[layer_idx] = [view]
            return view
        parts = self.parts[layer_idx]
        views = [cache.update(0, k[:, idx], v[:, idx], pos) for idx, cache in parts]
        self._views[layer_idx] = views
        return padded_view([idx for idx, _ in parts], views, pos)

    def observe(self, layer_idx: int, weights: Tensor | None) -> None:
        """A layer's attention weights [B, H, rows, S_max]: each part gets its query heads over its own slots."""
        views = self._views.pop(layer_idx, None)
        if views is None:
            return
        for (idx, cache), view in zip(self.parts[layer_idx], views):
            if weights is None or len(views) == 1:
                cache.observe(0, weights)
            else:
                cache.observe(0, part_weights(weights, idx, self.shape[2], view.keys.shape[2]))

    def advance(self, n_tokens: int) -> None:
        """Called by the model once all layers have processed ``n_tokens`` new tokens."""
        self.seen += n_tokens
        for parts in self.parts:
            for _, cache in parts:
                cache.advance(n_tokens)

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        """``rope(x, pos, rope_theta)`` for the model's fast path (every part rotates alike)."""
        return self.parts[0][0][1].rotate(x, pos)

    @property
    def row_seen(self) -> int:
        return self.seen

    # ----------------------------------------------------------------------------- compression
    def compress(self, budget: int | None = None) -> None:
        """Compress every part to its policy's prompt budget (or ``budget``); under a plan with an allocator, each
        layer of one part to the allocator's counts per head instead (``_allocate``)."""
        allocator = self.policy.plan.allocator
        for layer_idx, parts in enumerate(self.parts):
            if allocator is not None and budget is None and len(parts) == 1:
                self._allocate(layer_idx)
            else:
                for _, cache in parts:
                    cache.compress(budget)

    def _allocate(self, layer_idx: int) -> None:
        """Ada-KV (Feng et al. 2024, arXiv 2407.11550, Alg. 1): the layer's part scores its slots with its own
        policy (SnapKV's votes), the plan's allocator picks the slots each head keeps (one top-k over all heads of
        the layer), and each head moves to a one-head part holding exactly those (nothing is evicted while
        decoding afterwards, as under SnapKV)."""
        (idx, cache), = self.parts[layer_idx]
        layer = cache.layers[0]
        budget = cache.policy.prompt_budget
        if budget is None or layer.length <= budget:
            return
        if self.shape[1] != 1:
            raise ValueError(f"an allocator (Ada-KV) gives each batch row its own counts per head: compress one "
                             f"prompt at a time (batch=1), got batch={self.shape[1]}")
        keep = self.policy.plan.allocator(cache.policy.scores(layer, cache.row_seen))  # [1, H_kv, S] bool
        keys, values, positions = layer.live()
        parts = []
        for h in range(keep.shape[1]):
            slots = keep[0, h].nonzero().squeeze(-1)  # in slot order: a prompt's slots are in stream order
            one = self._part_cache(1, FullCache(), max_tokens=max(int(slots.numel()), 1))
            one.layers[0].append(keys[:, h : h + 1, slots], values[:, h : h + 1, slots], positions[:, h, slots])
            one.seen = cache.seen
            parts.append((idx[h : h + 1], one))
        self.parts[layer_idx] = parts

    # ----------------------------------------------------------------------------- rows
    def select_rows(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` ([B'] long), in that order, in every part."""
        for parts in self.parts:
            for _, cache in parts:
                cache.select_rows(index)
        self.shape = (self.shape[0], int(index.shape[0]), *self.shape[2:])

    # ----------------------------------------------------------------------------- sizes and contents
    def lengths_after(self, layer_idx: int, n_new: int) -> Tensor:
        """Slots each KV head of a layer will attend with once ``n_new`` new tokens are stored: [H_kv] long (a
        single token at a full budgeted part takes an evicted slot, ``KVCache.update``'s rule). The view's first
        that many slots of each head are real, the rest padding."""
        out = torch.zeros(self.shape[2], dtype=torch.long)
        for idx, cache in self.parts[layer_idx]:
            n, budget = cache.layers[0].length, cache.policy.budget
            out[idx.cpu()] = n if n_new == 1 and budget is not None and n >= budget else n + n_new
        return out

    def slots_per_head(self) -> Tensor:
        """Slots each KV head of each layer holds: [L, H_kv] long (every batch row holds as many)."""
        out = torch.zeros(self.shape[0], self.shape[2], dtype=torch.long)
        for layer_idx, parts in enumerate(self.parts):
            for idx, cache in parts:
                out[layer_idx, idx.cpu()] = cache.layers[0].length
        return out

    def kept_positions(self, layer_idx: int, row: int = 0) -> list[Tensor]:
        """Per KV head of a layer, the sorted original positions it holds (batch row ``row``): H_kv tensors [n_h]."""
        out: list[Tensor] = [torch.empty(0, dtype=torch.long)] * self.shape[2]
        for idx, cache in self.parts[layer_idx]:
            positions = cache.layers[0].live()[2][row]  # [h_part, n_part]
            for j, h in enumerate(idx.tolist()):
                out[h] = positions[j].sort().values.cpu()
        return out

    @property
    def layers(self) -> list[PaddedLayer]:
        """Every layer's slots, padded to its longest head (for reading, as ``KVCache.layers``)."""
        return [self._padded(i) for i in range(self.shape[0])]

    def _padded(self, layer_idx: int) -> PaddedLayer:
        whole = self._whole(layer_idx)
        if whole is not None:
            return PaddedLayer(*whole.layers[0].live())
        parts = self.parts[layer_idx]
        n = max(cache.layers[0].length for _, cache in parts)
        _, b, kv, d = self.shape
        first = parts[0][1].layers[0]
        keys, values = first.keys.new_zeros(b, kv, n, d), first.values.new_zeros(b, kv, n, d)
        positions = first.positions.new_full((b, kv, n), -1)
        for idx, cache in parts:
            k, v, p = cache.layers[0].live()
            keys[:, idx, : k.shape[2]], values[:, idx, : k.shape[2]], positions[:, idx, : k.shape[2]] = k, v, p
        return PaddedLayer(keys, values, positions)

    def positions(self, layer_idx: int = 0) -> Tensor:
        """Original positions cached in a layer, padded: [B, H_kv, S_max] (-1 past a head's slots)."""
        return self._padded(layer_idx).positions

    @property
    def n_slots(self) -> int:
        """Slots held by the fullest KV head of any layer."""
        return int(self.slots_per_head().max())

    def bytes_at(self, dtype_bytes: int) -> int:
        """Bytes of keys and values in use, as each part's store counts its own slots (``KVCache.bytes_at``): the
        sum over heads of their own lengths, not the padded view's."""
        return sum(cache.bytes_at(dtype_bytes) for parts in self.parts for _, cache in parts)

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values in use, at the cache's dtype."""
        return self.bytes_at(torch.finfo(self.dtype).bits // 8)

    @property
    def allocated_bytes(self) -> int:
        """Bytes the parts' preallocated storage occupies (>= nbytes)."""
        return sum(cache.allocated_bytes for parts in self.parts for _, cache in parts)

    def __repr__(self) -> str:
        n, b, h, d = self.shape
        return (f"HeadwiseCache(layers={n}, batch={b}, kv_heads={h}, head_dim={d}, slots={self.n_slots}, "
                f"seen={self.seen}, policy={self.policy!r}, {self.nbytes / 2**20:.2f} MiB)")
