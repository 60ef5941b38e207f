"""The cache: one ``LayerCache`` per layer, the policy that decides which slots survive and the store that holds
their numbers (``KVCache``): the layer's two calls (``update``, ``observe``), the decode step's eviction and the
prompt's compression.

The cache is the only partner of attention. A layer hands it the new tokens' keys and values (``update``) and gets
back an ``AttentionView``; it hands the weights back with ``observe``. Policies never see the model, and the model
never sees the policy. Its other seams live beside it: the position rules (``course.kvcache.positions``), the
rotation of cached keys (``course.kvcache.rotation``), the store's calls (``course.kvcache.stored``) and the sizes
and set-up for measurements (``course.kvcache.inspection``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from course.kvcache.inspection import Inspection
from course.kvcache.positions import attention_mask, rope_positions
from course.kvcache.rotation import KeyRotation
from course.kvcache.stored import StoreKeeper
from course.kvcache.view import AttentionView, Chunks, SinkRotation
from course.policies import FullCache, Policy
from course.slots import LayerCache, allocate
from course.storage import FullPrecision, Storage

__all__ = ["KVCache"]


@dataclass
class _Eviction:
    """A decode step's choice at a full layer (``KVCache._evict``): made once, reused by every layer when the policy
    is decided by positions alone. key: (tokens seen, slots) when it was made; moved, offsets, tables: in a rotated
    cache, the keys that come a position closer, their new offsets and RoPE's tables for them (None: placed from
    the ranks instead)."""

    key: tuple[int, int]
    victim: Tensor
    moved: tuple[Tensor, ...] | None = None
    offsets: Tensor | None = None
    tables: tuple[Tensor, Tensor] | None = None


class KVCache(Inspection):
    """The whole model's cache: one ``LayerCache`` per layer plus the policy that manages it and
    the store that holds it.

    Create it with ``model.new_cache(batch, policy)``, which fills in the shapes. ``seen`` is
    the number of tokens of the stream processed so far: the next token's original position.

    ``chunks`` says what a forward of several tokens at once means:

    * ``"prompt"`` (default): a prompt. Every token attends causally to everything before it (full
      attention, whatever the policy); the cache may then hold more than the budget until
      ``compress`` cuts it back (``course.compression.compress_prompt`` does both).
    * ``"stream"``: a chunk of a stream, as the exact evaluator runs it. For policies decided by
      positions alone, each token sees exactly the keys the token-by-token decode loop would have
      cached when it was decoded.

    ``rope_theta`` says how keys arrive:

    * ``None`` (default): as the model computed them, not rotated; the readable Llama rotates every
      cached key at every step with the positions the view gives (GPT-2 has no rotation at all);
    * a RoPE base: already rotated at their original positions, as transformers caches them
      (``course.transformers_cache``) and as the course's Llama does on its fast path. The cache then
      keeps every key rotated where the policy's position rule puts it (see ``_place``): nothing moves
      under original positions; under positions inside the cache only the keys whose distance to the
      query changes are rotated again (StreamingLLM: the sinks), each from the key as it arrived, by its
      whole offset, in float32, so that no rounding adds up however long the stream. Those caches keep
      the arrived keys beside the rotated ones (``LayerCache.originals``): their keys take twice the memory.

    ``start`` ([B] long, or None): the column at which each row's stream begins, in a batch of prompts padded
    on the left (``course.transformers_cache``). Padding is stored in slots at position -1, which no query
    sees (the caller masks them), no policy keeps (they are always the first to go) and no rule counts.
    """

    def __init__(
        self,
        n_layers: int,
        batch: int,
        kv_heads: int,
        head_dim: int,
        *,
        policy: Policy | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        capacity: int = 64,
        chunks: Chunks = "prompt",
        max_tokens: int | None = None,
        rope_theta: float | None = None,
        storage: Storage | None = None,
    ) -> None:
        _check_arguments(n_layers, batch, kv_heads, head_dim, chunks, max_tokens, rope_theta)
        self.policy: Policy = policy if policy is not None else FullCache()
        self.chunks: Chunks = chunks
        # the store: the one given, else the one chosen beside the policy (make_policy(..., quantizer=...))
        self.storage: Storage = storage or getattr(self.policy, "quantizer", None) or FullPrecision()
        self.storage.check_head_dim(head_dim)
        self.shape = (n_layers, batch, kv_heads, head_dim)
        self.dtype = dtype
        self.rope_theta = rope_theta
        self.layers = self._allocate(capacity, max_tokens, device)
        self.seen = 0
        self.start: Tensor | None = None  # [B] where each row's stream begins (a left-padded batch), or None
        self._rotation = KeyRotation(rope_theta) if rope_theta is not None else None
        self._step: _Eviction | None = None  # the current decode step's eviction (see _evict)
        self._weight_rows: dict[int, int] = {}  # what the policy asked for in the last update, per layer
        self._store = StoreKeeper(self.storage, n_layers, batch)

    def _allocate(self, capacity: int, max_tokens: int | None, device: torch.device | str) -> list[LayerCache]:
        """Every layer's slots, for min(budget, tokens that can exist): a budgeted cache starts at most at
        ``capacity`` slots (or ``max_tokens``, the most the caller will feed) and doubles up to budget + 1, so a
        budget far above the stream's length costs no memory. A rotated cache whose policy moves keys also keeps
        each key as it arrived and its offset."""
        _, batch, kv_heads, head_dim = self.shape
        limit = None if self.policy.budget is None else self.policy.budget + 1
        if max_tokens is not None:
            capacity = max_tokens
        if limit is not None:
            capacity = min(capacity, limit)
        moves = self.rope_theta is not None and self.policy.position_rule == "cache"  # keys are rotated again
        slots = (batch, kv_heads, capacity)
        return [
            LayerCache(
                keys=allocate((*slots, head_dim), 0.0, self.dtype, device),
                values=allocate((*slots, head_dim), 0.0, self.dtype, device),
                positions=allocate(slots, -1, torch.long, device),
                max_capacity=limit,
                originals=allocate((*slots, head_dim), 0.0, self.dtype, device) if moves else None,
                offsets=allocate(slots, 0, torch.long, device) if moves else None,
            )
            for _ in range(self.shape[0])
        ]

    # ----------------------------------------------------------------------------- the layer's two calls
    def update(self, layer_idx: int, k: Tensor, v: Tensor, pos: Tensor, mask: bool = True) -> AttentionView:
        """Store the new tokens' K/V and return everything the layer attends with.

        k, v: [B, H_kv, T, d] (keys not yet rotated, or rotated at ``pos`` in a cache made with ``rope_theta``);
        pos: [B, T] original positions (-1: padding). ``mask=False``: the caller masks attention itself
        (transformers does), so the view's mask is not built.

        A single new token (decode) that finds the cache at its budget takes the slot of the
        policy's victim, so the token attends to exactly ``budget`` keys, its own included.
        Several new tokens (a prompt, or a chunk of the exact evaluator) are appended; the
        caller then calls ``compress`` to come back to the budget.
        """
        layer = self.layers[layer_idx]
        if k.shape[0] != self.shape[1] or k.shape[1] != self.shape[2] or k.shape[3] != self.shape[3]:
            raise ValueError(
                f"this cache holds [batch={self.shape[1]}, kv_heads={self.shape[2]}, head_dim={self.shape[3]}] "
                f"but layer {layer_idx} gave keys of shape {tuple(k.shape)}: was it made by another model?"
            )
        if self.storage.rounds:  # tokens that left the store's full precision are rounded before the new ones arrive
            self._settle(layer, layer_idx, k, pos)
        budget = self.policy.budget
        if k.shape[2] == 1 and budget is not None and layer.length >= budget:
            self._evict(layer, k, v, pos)
        else:
            layer.append(k, v, pos)
            if layer.originals is not None and not layer.placed:  # (appended tokens move no key)
                self._place(layer, self._offsets_now(layer, pos))
        keys, values, k_pos = layer.live()
        self._weight_rows[layer_idx] = self.policy.attention_rows(k.shape[2])
        return AttentionView(keys, values, k_pos, self._attention_mask(k_pos, pos) if mask else None,
                             self._weight_rows[layer_idx], k.shape[2], lambda: self._rope_positions(k_pos, pos))

    def _settle(self, layer: LayerCache, layer_idx: int, k: Tensor, pos: Tensor) -> None:
        """The store's rounding before the new tokens ``k`` at ``pos`` arrive (``StoreKeeper.settle``); a rounded key
        that the policy moved is placed again from its rounded self."""
        if self._streamed() and k.shape[2] > 1:
            self.storage.check_chunk(int(pos.min()), k.shape[2])
        moved = None
        if layer.originals is not None:
            def moved(slots: tuple[Tensor, ...]) -> None:
                offsets = layer.offsets[slots]
                self._rotation.rotate_slots(layer, slots, offsets, self._rotation.tables_of(offsets, layer.keys))
        self._store.settle(layer, layer_idx, pos, self.rope_theta is not None, moved)

    def observe(self, layer_idx: int, weights: Tensor | None) -> None:
        """Hand a layer's attention weights ([B, H, rows, S], the last query rows) back to the policy.

        Only the last ``AttentionView.weight_rows`` rows reach it; policies that read no weights get nothing."""
        rows = self._weight_rows.pop(layer_idx, 0) if weights is not None else 0
        if rows:
            self.policy.observe(self.layers[layer_idx], weights[:, :, weights.shape[2] - rows :], self.row_seen)

    def advance(self, n_tokens: int) -> None:
        """Called by the model once all layers have processed ``n_tokens`` new tokens."""
        self.seen += n_tokens

    # ----------------------------------------------------------------------------- eviction
    def _evict(self, layer: LayerCache, k: Tensor, v: Tensor, pos: Tensor) -> None:
        """One new token at a full layer: it takes the slot of the policy's victim. In a rotated cache, every key
        older than the evicted one comes a position closer to the query (see ``course.kvcache.rotation``).

        A policy decided by positions alone (``is_static``) keeps the same slots in every layer, so its choice (the
        victim, the keys that move and their rotation) is made once per step, in the first layer, and reused."""
        shared = self._step if self.policy.is_static and layer.placed else None
        if shared is None or shared.key != (self.seen, layer.length):
            shared = self._choose(layer)
            if self.policy.is_static and layer.placed:
                self._step = shared
        layer.overwrite(shared.victim, k, v, pos)
        if layer.originals is None:
            return
        if shared.moved is None:  # ranks of the policy's own, or slots gathered since: every key placed afresh
            self._place(layer, self._offsets_now(layer, pos))
        else:
            self._rotation.rotate_slots(layer, shared.moved, shared.offsets, shared.tables)

    def _choose(self, layer: LayerCache) -> _Eviction:
        """The policy's victim at a full layer and, in a rotated cache placed by ranks, the keys that move."""
        victim = self._scores(layer).argmin(dim=-1)  # [B, H_kv]
        choice = _Eviction((self.seen, layer.length), victim)
        if layer.originals is not None and layer.placed and type(self.policy).cache_ranks is Policy.cache_ranks:
            k_pos = layer.positions[:, :, : layer.length]
            older = k_pos < k_pos.gather(2, victim[:, :, None])
            choice.moved = (older & (k_pos >= 0) if self.start is not None else older).nonzero(as_tuple=True)
            choice.offsets = layer.offsets[:, :, : layer.length][choice.moved] + 1
            choice.tables = self._rotation.tables_of(choice.offsets, layer.keys)
        return choice

    def compress(self, budget: int | None = None) -> None:
        """Evict down to ``budget`` slots (default: the policy's) in every layer, keeping the best scored."""
        budget = self.policy.prompt_budget if budget is None else budget
        if budget is None:
            return
        for layer in self.layers:
            if layer.length > budget:
                keep = self._scores(layer).topk(budget, dim=-1).indices.sort(dim=-1).values
                layer.gather(keep)
                layer.placed = True
                if layer.originals is not None:  # the kept keys' new ranks: each placed afresh
                    self._place(layer, self._offsets_after(layer))

    @property
    def row_seen(self) -> int | Tensor:
        """The tokens each row's stream has had: ``seen``, or in a left-padded batch ``seen`` less each row's
        padding ([B, 1, 1], broadcasting over heads and slots). What a policy's ``scores`` and ``observe`` get."""
        return self.seen if self.start is None else (self.seen - self.start)[:, None, None]

    def _scores(self, layer: LayerCache) -> Tensor:
        """The policy's keep-priorities of a layer's slots, padding (position -1) always the lowest."""
        scores = self.policy.scores(layer, self.row_seen)
        if self.start is not None:
            scores = scores.masked_fill(layer.positions[:, :, : layer.length] < 0, -math.inf)
        return scores

    def select_rows(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` ([B'] long, repeats allowed), in that order, in every layer: beam search
        reorders its beams so, and repeating a row gives several continuations of one prompt."""
        for layer in self.layers:
            layer.select_rows(index)
        self._store.select_rows(index.tolist())
        if self.start is not None:
            self.start = self.start.index_select(0, index)
        self.shape = (self.shape[0], int(index.shape[0]), *self.shape[2:])

    # ----------------------------------------------------------------------------- rotated caches
    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        """``rope(x, pos, rope_theta)`` for the model's fast path (``KeyRotation.rotate``: its tables once per
        forward)."""
        return self._rotation.rotate(x, pos, self.seen)

    def _offsets_after(self, layer: LayerCache) -> Tensor:
        """Every key's offset between forwards (the next query at rank S, after ``seen`` tokens): [B, H_kv, S]."""
        k_pos = layer.live()[2]
        return self.policy.cache_ranks(k_pos) + self.row_seen - layer.length - k_pos

    def _offsets_now(self, layer: LayerCache, q_pos: Tensor) -> Tensor:
        """Every key's offset for the queries at ``q_pos`` ([B, T]) now stored: ``k_rope + q_pos - q_rope``."""
        k_pos = layer.live()[2]
        q_rope, k_rope, _ = self._rope_positions(k_pos, q_pos)
        return k_rope + (q_pos - q_rope)[:, -1:, None] - k_pos

    def _place(self, layer: LayerCache, offset: Tensor) -> None:
        """Give every key of a layer the offset ``offset`` ([B, H_kv, S]) (``KeyRotation.place``)."""
        self._rotation.place(layer, offset)

    # ----------------------------------------------------------------------------- what a layer attends with
    def rope_positions(self, layer_idx: int, q_pos: Tensor) -> tuple[Tensor, Tensor, SinkRotation | None]:
        """The RoPE positions a layer's queries at ``q_pos`` ([B, T]) and its cached keys would get now
        (for inspection; ``update`` hands them to the layer)."""
        return self._rope_positions(self.layers[layer_idx].live()[2], q_pos)

    def _rope_positions(self, k_pos: Tensor, q_pos: Tensor) -> tuple[Tensor, Tensor, SinkRotation | None]:
        """``course.kvcache.positions.rope_positions`` under this cache's policy and chunks."""
        return rope_positions(self.policy, self._streamed(), k_pos, q_pos)

    def _attention_mask(self, k_pos: Tensor, q_pos: Tensor) -> Tensor | None:
        """``course.kvcache.positions.attention_mask`` under this cache's policy and chunks."""
        return attention_mask(self.policy, self._streamed(), k_pos, q_pos)

    def _streamed(self) -> bool:
        """Do chunks of several tokens stand for a stream the decode loop would have evicted from?"""
        return self.chunks == "stream" and self.policy.is_static


def _check_arguments(n_layers: int, batch: int, kv_heads: int, head_dim: int, chunks: str, max_tokens: int | None,
                     rope_theta: float | None) -> None:
    """``KVCache``'s refusals, by parameter."""
    if min(n_layers, batch, kv_heads, head_dim) < 1:
        raise ValueError(
            f"KVCache needs n_layers, batch, kv_heads, head_dim >= 1, got "
            f"{n_layers}, {batch}, {kv_heads}, {head_dim}"
        )
    if chunks not in ("prompt", "stream"):
        raise ValueError(f"chunks must be 'prompt' or 'stream', got {chunks!r}")
    if rope_theta is not None and chunks == "stream":
        raise ValueError("chunks='stream' (the exact evaluator) needs keys cached before rotation: rope_theta=None")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < 1):
        raise ValueError(f"max_tokens must be an integer >= 1 (or None), got {max_tokens!r}")
