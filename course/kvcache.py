"""The KV cache: what a decoder keeps so that it never recomputes the past.

Every layer stores, for every token it has seen and not evicted, one key and one value
vector per KV head, together with the token's *original* position in the stream:

    keys[l], values[l] : [batch, kv_heads, slots, head_dim]
    positions[l]       : [batch, kv_heads, slots]          (original position of each slot)

Storage is preallocated and grows by doubling, so appending a token never copies the whole
cache (no ``torch.cat`` per step). When a budgeted policy is full, the new token is written
*into the slot of the evicted one* (per batch row and KV head: H2O and SnapKV keep different
tokens in different heads). Attention is permutation invariant over keys as long as each key
carries its position, so slot order does not matter.

Keys are stored before any rotary embedding, so the model can give cached keys new
positions (StreamingLLM's position re-assignment, see ``rope_positions``): the readable path,
where the model rotates every cached key at every step. A cache made with ``rope_theta`` takes
keys already rotated at their original positions instead (as transformers caches them, and the
course's Llama on its fast path) and keeps each one rotated where the policy puts it: only the
keys the policy moves are rotated again, always from the key as it arrived, in float32.

The memory a cache costs is 2 (K and V) x layers x kv_heads x head_dim x tokens x bytes
(``cache_bytes_per_token``, the one formula the course uses): ``nbytes`` reports it for the slots
in use.

The cache is the only partner of attention. A layer hands it the new tokens' keys and values
(``update``) and gets back an ``AttentionView``: everything it attends with (keys, values, the
positions RoPE should use, the mask, how many rows of weights the policy wants); it hands the
weights back with ``observe``. Policies never see the model, and the model never sees the policy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from course.policies import FullCache, Policy
from course.quantize import GROUP_STAT
from course.rope import rope, rope_tables

__all__ = ["LayerCache", "KVCache", "CacheGroup", "AttentionView", "SinkRotation", "cache_bytes_per_token", "Chunks",
           "prefill_bytes_per_token", "longest_prompt"]

Chunks = Literal["prompt", "stream"]


def cache_bytes_per_token(n_layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes one token occupies in the cache: 2 (K and V) * L * H_kv * d * bytes per number."""
    return 2 * n_layers * kv_heads * head_dim * dtype_bytes


def _no_grad(fn):
    """``torch.no_grad()`` for the cache's writes, skipped where gradients are off already (decoding runs under
    ``torch.inference_mode``): a decorator's cost, paid by every layer at every step, is not negligible there."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not torch.is_grad_enabled():
            return fn(*args, **kwargs)
        with torch.no_grad():
            return fn(*args, **kwargs)

    return wrapper


def prefill_bytes_per_token(config, dtype_bytes: int) -> int:
    """Bytes of activations one prompt token holds at the busiest moment of a block during a prefill, counted from
    the model's shapes: the residual stream and the normalised input, then the larger of attention's tensors (queries,
    keys and values, their rotated copies, the attention output and its projection) and the MLP's (its d_ff-wide
    intermediates: gate, up, the activation and the product for SwiGLU; the hidden layer and its activation for
    GPT-2) and its output. Assumes an attention kernel whose memory grows with T, not T x T (FlashAttention, as
    long-context systems run a prefill); every operation allocating its output."""
    d, kv = config.d_model, config.n_kv_head * config.head_dim
    attention = 2 * d + 3 * config.n_head * config.head_dim + 3 * kv + d
    wide = 4 if config.family == "llama" else 2
    mlp = 2 * d + wide * config.d_ff + d
    return max(attention, mlp) * dtype_bytes


def longest_prompt(memory: int, weights: int, config, dtype_bytes: int, keep: int | None = None) -> int:
    """The longest prompt whose prefill fits in ``memory`` bytes (batch 1), with the whole prompt cached (``keep``
    None) or with every layer compressed to ``keep`` slots as soon as its own prefill ends (SnapKV's own
    implementation does this: at the peak one layer holds the whole prompt's keys and values, the others ``keep``
    slots each). ``weights``: the model's bytes; activations from ``prefill_bytes_per_token``, the cache from
    ``cache_bytes_per_token``. Computed, not measured. 0 when not even one token fits."""
    act = prefill_bytes_per_token(config, dtype_bytes)
    per_layer = cache_bytes_per_token(1, config.n_kv_head, config.head_dim, dtype_bytes)
    room = memory - weights
    if keep is None:
        return max(0, room // (act + per_layer * config.n_layer))
    room -= per_layer * keep * (config.n_layer - 1)
    return max(0, room // (act + per_layer))


def _storage(shape: tuple[int, ...], fill: float, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """Cache storage: a plain tensor even when made under ``torch.inference_mode`` (so that the
    cache can be updated in place later, inside or outside inference mode)."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.full(shape, fill, dtype=dtype, device=device)


@dataclass
class SinkRotation:
    """How pinned sinks are rotated when many queries under the cache rule run at once.

    query_positions: [B, T] the position each query takes when it scores a pinned key;
    pinned: [B, H_kv, S] which keys are pinned sinks (rotated with their own position).
    """

    query_positions: Tensor
    pinned: Tensor


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


@dataclass
class AttentionView:
    """Everything one layer attends with, as the cache and its policy decide (``KVCache.update``).

    keys, values:   [B, H_kv, S, d] every cached slot of the layer; keys *not* rotated, or, in a cache
                    made with ``rope_theta``, already rotated so that a query rotated at its original
                    position sees each key at the policy's distance ``q_rope - k_rope``;
    positions:      [B, H_kv, S] the original position of each slot;
    q_rope, k_rope: the positions RoPE rotates the queries ([B, T]) and keys ([B, H_kv, S]) by,
                    under the policy's position rule (GPT-2, whose positions enter at the input,
                    ignores them); computed when first read (a rotated cache's keys need none);
    sink_rotation:  None, or how pinned sinks are scored in a chunk of the exact evaluator;
    mask:           [B, H_kv, T, S] bool, True where a query may attend; None: every query sees every slot;
    weight_rows:    how many of the last queries' attention weights the policy wants back (``observe``).
    """

    keys: Tensor
    values: Tensor
    positions: Tensor
    mask: Tensor | None
    weight_rows: int
    n_queries: int
    rope_positions: Callable[[], tuple[Tensor, Tensor, SinkRotation | None]] = field(repr=False)
    _rope: tuple[Tensor, Tensor, SinkRotation | None] | None = field(default=None, repr=False)

    def _positions(self) -> tuple[Tensor, Tensor, SinkRotation | None]:
        if self._rope is None:
            self._rope = self.rope_positions()
        return self._rope

    @property
    def q_rope(self) -> Tensor:
        return self._positions()[0]

    @property
    def k_rope(self) -> Tensor:
        return self._positions()[1]

    @property
    def sink_rotation(self) -> SinkRotation | None:
        return self._positions()[2]

    def rows(self, want_weights: bool) -> int:
        """Rows of attention weights to compute: all queries' if the caller wants them, else the policy's."""
        return self.n_queries if want_weights else self.weight_rows


@dataclass
class LayerCache:
    """The keys, values and positions of one layer, in preallocated slots.

    Only the first ``length`` slots are in use. ``stats`` holds per-slot numbers that a
    policy keeps (e.g. H2O's accumulated attention); they move with their slot when the
    cache grows, overwrites or gathers, and start at zero for a new token.
    """

    keys: Tensor  # [B, H_kv, capacity, d]
    values: Tensor  # [B, H_kv, capacity, d]
    positions: Tensor  # [B, H_kv, capacity] long; -1 where unused
    length: int = 0
    stats: dict[str, Tensor] = field(default_factory=dict)  # name -> [B, H_kv, capacity]
    max_capacity: int | None = None  # doubling stops here (a budgeted cache: budget + 1), unless more are needed
    # Only in a cache that re-rotates keys (``rope_theta`` and positions inside the cache): each key as it arrived,
    # and how far (in positions) the key in ``keys`` is rotated beyond it. They move with their slot.
    originals: Tensor | None = None  # [B, H_kv, capacity, d]
    offsets: Tensor | None = None  # [B, H_kv, capacity] long
    # False after slots were gathered from outside the cache's own updates: the layer then makes its own eviction
    # choices (never one shared with other layers), and a rotated cache places its keys afresh at the next update.
    placed: bool = True

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def live(self) -> tuple[Tensor, Tensor, Tensor]:
        """Views of the slots in use: keys/values [B, H_kv, length, d], positions [B, H_kv, length]."""
        n = self.length
        return self.keys[:, :, :n], self.values[:, :, :n], self.positions[:, :, :n]

    def stat(self, name: str) -> Tensor:
        """The per-slot statistic ``name`` ([B, H_kv, length], float32), created at zero."""
        if name not in self.stats:
            self.stats[name] = _storage(self.positions.shape, 0.0, torch.float32, self.keys.device)
        return self.stats[name][:, :, : self.length]

    def _reserve(self, needed: int) -> None:
        """Grow storage (doubling) so that ``needed`` slots fit."""
        if needed <= self.capacity:
            return
        new_cap = max(2 * self.capacity, 16)
        if self.max_capacity is not None:
            new_cap = min(new_cap, self.max_capacity)
        new_cap = max(needed, new_cap)

        def grow(t: Tensor, fill: float) -> Tensor:
            out = _storage((*t.shape[:2], new_cap, *t.shape[3:]), fill, t.dtype, t.device)
            out[:, :, : self.length] = t[:, :, : self.length]
            return out

        self.keys, self.values = grow(self.keys, 0.0), grow(self.values, 0.0)
        self.positions = grow(self.positions, -1)
        self.stats = {k: grow(v, 0.0) for k, v in self.stats.items()}
        if self.originals is not None:
            self.originals, self.offsets = grow(self.originals, 0.0), grow(self.offsets, 0)

    @_no_grad
    def append(self, k: Tensor, v: Tensor, pos: Tensor) -> None:
        """Write T new tokens after the last slot. k, v: [B, H_kv, T, d]; pos: [B, T]."""
        t = k.shape[2]
        self._reserve(self.length + t)
        sl = slice(self.length, self.length + t)
        self.keys[:, :, sl] = k
        self.values[:, :, sl] = v
        self.positions[:, :, sl] = pos[:, None, :]
        for s in self.stats.values():
            s[:, :, sl] = 0.0
        if self.originals is not None:
            self.originals[:, :, sl] = k
            self.offsets[:, :, sl] = 0
        self.length += t

    @_no_grad
    def overwrite(self, slot: Tensor, k: Tensor, v: Tensor, pos: Tensor) -> None:
        """Write one new token into the given slot of every (batch, head), evicting its occupant.

        slot: [B, H_kv] long; k, v: [B, H_kv, 1, d]; pos: [B, 1].
        """
        one = slot[:, :, None]  # [B, H_kv, 1]
        idx = one[..., None].expand(-1, -1, 1, k.shape[-1])
        self.keys.scatter_(2, idx, k)
        self.values.scatter_(2, idx, v)
        self.positions.scatter_(2, one, pos[:, None, :].expand(-1, slot.shape[1], -1))
        for s in self.stats.values():
            s.scatter_(2, one, 0.0)
        if self.originals is not None:
            self.originals.scatter_(2, idx, k)
            self.offsets.scatter_(2, one, 0)

    @_no_grad
    def gather(self, index: Tensor) -> None:
        """Keep only the slots in ``index`` ([B, H_kv, K] long), in that order, in place."""
        k = index.shape[-1]
        idx = index[..., None].expand(-1, -1, -1, self.keys.shape[-1])
        self.keys[:, :, :k] = self.keys[:, :, : self.length].gather(2, idx)
        self.values[:, :, :k] = self.values[:, :, : self.length].gather(2, idx)
        self.positions[:, :, :k] = self.positions[:, :, : self.length].gather(2, index)
        for s in self.stats.values():
            s[:, :, :k] = s[:, :, : self.length].gather(2, index)
        if self.originals is not None:
            self.originals[:, :, :k] = self.originals[:, :, : self.length].gather(2, idx)
            self.offsets[:, :, :k] = self.offsets[:, :, : self.length].gather(2, index)
        self.positions[:, :, k:] = -1
        self.length = k
        self.placed = False  # (the kept keys have new ranks)

    @_no_grad
    def select_rows(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` ([B'] long), in that order (beam search reorders its beams so)."""
        self.keys, self.values = self.keys.index_select(0, index), self.values.index_select(0, index)
        self.positions = self.positions.index_select(0, index)
        self.stats = {k: v.index_select(0, index) for k, v in self.stats.items()}
        if self.originals is not None:
            self.originals, self.offsets = self.originals.index_select(0, index), self.offsets.index_select(0, index)


class KVCache:
    """The whole model's cache: one ``LayerCache`` per layer plus the policy that manages it.

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
    ) -> None:
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
        self.policy: Policy = policy if policy is not None else FullCache()
        self.chunks: Chunks = chunks
        self.quantizer = self.policy.quantizer
        if self.quantizer is not None:
            self.quantizer.check_head_dim(head_dim)
        # Allocate for min(budget, tokens that can exist): a budgeted cache starts at most at
        # ``capacity`` slots (or ``max_tokens``, the most the caller will feed) and doubles up to
        # budget + 1, so a budget far above the stream's length costs no memory.
        limit = None if self.policy.budget is None else self.policy.budget + 1
        if max_tokens is not None:
            capacity = max_tokens
        if limit is not None:
            capacity = min(capacity, limit)
        self.shape = (n_layers, batch, kv_heads, head_dim)
        self.dtype = dtype
        self.rope_theta = rope_theta
        moves = rope_theta is not None and self.policy.position_rule == "cache"  # keys are rotated again
        self.layers = [
            LayerCache(
                keys=_storage((batch, kv_heads, capacity, head_dim), 0.0, dtype, device),
                values=_storage((batch, kv_heads, capacity, head_dim), 0.0, dtype, device),
                positions=_storage((batch, kv_heads, capacity), -1, torch.long, device),
                max_capacity=limit,
                originals=_storage((batch, kv_heads, capacity, head_dim), 0.0, dtype, device) if moves else None,
                offsets=_storage((batch, kv_heads, capacity), 0, torch.long, device) if moves else None,
            )
            for _ in range(n_layers)
        ]
        self.seen = 0
        self.start: Tensor | None = None  # [B] where each row's stream begins (a left-padded batch), or None
        self._tables: tuple | None = None  # rotate's RoPE tables of the current forward
        self._step: _Eviction | None = None  # the current decode step's eviction (see _evict)
        self._weight_rows: dict[int, int] = {}  # what the policy asked for in the last update, per layer
        self._settled = [[0] * batch for _ in range(n_layers)]  # quantized store: per layer and batch row, the
        # position where the next key group starts

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
        if self.quantizer is not None:  # tokens that left the residual are quantized before the new ones arrive
            if self._streamed() and k.shape[2] > 1:
                self.quantizer.check_chunk(int(pos.min()), k.shape[2])
            self._settle(layer, layer_idx, pos)
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

    def _evict(self, layer: LayerCache, k: Tensor, v: Tensor, pos: Tensor) -> None:
        """One new token at a full layer: it takes the slot of the policy's victim. In a rotated cache, every key
        older than the evicted one comes a position closer to the query (see ``_place``).

        A policy decided by positions alone (``is_static``) keeps the same slots in every layer, so its choice (the
        victim, the keys that move and their rotation) is made once per step, in the first layer, and reused."""
        shared = self._step if self.policy.is_static and layer.placed else None
        if shared is None or shared.key != (self.seen, layer.length):
            victim = self._scores(layer).argmin(dim=-1)  # [B, H_kv]
            shared = _Eviction((self.seen, layer.length), victim)
            if layer.originals is not None and layer.placed and type(self.policy).cache_ranks is Policy.cache_ranks:
                k_pos = layer.positions[:, :, : layer.length]
                older = k_pos < k_pos.gather(2, victim[:, :, None])
                shared.moved = (older & (k_pos >= 0) if self.start is not None else older).nonzero(as_tuple=True)
                shared.offsets = layer.offsets[:, :, : layer.length][shared.moved] + 1
                shared.tables = self._tables_of(shared.offsets, layer.keys)
            if self.policy.is_static and layer.placed:
                self._step = shared
        layer.overwrite(shared.victim, k, v, pos)
        if layer.originals is None:
            return
        if shared.moved is None:  # ranks of the policy's own, or slots gathered since: every key placed afresh
            self._place(layer, self._offsets_now(layer, pos))
        else:
            self._rotate(layer, shared.moved, shared.offsets, shared.tables)

    def observe(self, layer_idx: int, weights: Tensor | None) -> None:
        """Hand a layer's attention weights ([B, H, rows, S], the last query rows) back to the policy.

        Only the last ``AttentionView.weight_rows`` rows reach it; policies that read no weights get nothing."""
        rows = self._weight_rows.pop(layer_idx, 0) if weights is not None else 0
        if rows:
            self.policy.observe(self.layers[layer_idx], weights[:, :, weights.shape[2] - rows :], self.row_seen)

    def advance(self, n_tokens: int) -> None:
        """Called by the model once all layers have processed ``n_tokens`` new tokens."""
        self.seen += n_tokens

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

    def select_rows(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` ([B'] long, repeats allowed), in that order, in every layer: beam search
        reorders its beams so, and repeating a row gives several continuations of one prompt."""
        for layer in self.layers:
            layer.select_rows(index)
        rows = index.tolist()
        self._settled = [[settled[i] for i in rows] for settled in self._settled]
        if self.start is not None:
            self.start = self.start.index_select(0, index)
        self.shape = (self.shape[0], int(index.shape[0]), *self.shape[2:])

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

    # ----------------------------------------------------------------------------- rotated caches
    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        """``rope(x, pos, rope_theta)`` for the model's fast path. Every layer of a forward rotates its queries and
        keys at the same positions, so the cos/sin tables are computed once per forward (kept while ``pos`` is the
        same tensor and the stream has not advanced)."""

        memo = self._tables
        if memo is None or memo[0] is not pos or memo[1] != self.seen or memo[2] != x.dtype:
            memo = self._tables = (pos, self.seen, x.dtype, rope_tables(pos, self.rope_theta, x.shape[-1], x.dtype))
        return rope(x, pos, self.rope_theta, memo[3])

    # A rotated cache keeps every key rotated at ``k_rope + q_pos - q_rope`` (its own position under the policy's
    # rule, plus the query's offset), so that a query rotated at its original position ``q_pos`` sees it at the
    # policy's distance ``q_rope - k_rope`` (RoPE scores depend on distances only). That is ``offset`` positions
    # beyond the key's original position: under positions inside the cache, the number of tokens evicted between
    # the key and the query. The recent window of StreamingLLM therefore never moves, and its sinks move one
    # position closer at every eviction. A key is rotated only when its offset changes, each time from its
    # original (``layer.originals``) by its whole offset, in float32 (float64 for a float64 cache), then cast:
    # never a rotation of a rotation, whose rounding would add up over the stream in half precision.

    def _offsets_after(self, layer: LayerCache) -> Tensor:
        """Every key's offset between forwards (the next query at rank S, after ``seen`` tokens): [B, H_kv, S]."""
        k_pos = layer.live()[2]
        return self.policy.cache_ranks(k_pos) + self.row_seen - layer.length - k_pos

    @_no_grad
    def _settle(self, layer: LayerCache, layer_idx: int, pos: Tensor) -> None:
        """The quantized store's rounding (``KIVI.settle``) before the new tokens at ``pos`` ([B, T], -1: padding)
        arrive, row by row at each row's first new position (the rows of a left-padded batch are at different
        positions of their streams), so that every row is stored as it would be alone. In a cache whose policy moves
        rotated keys (``originals``), the keys are rounded as they arrived and each rounded key is placed again from
        there: a key the policy moves later moves rounded."""
        keys, values, k_pos = layer.live()
        arrived = None if layer.originals is None else layer.originals[:, :, : layer.length]
        group_id = layer.stat(GROUP_STAT)
        firsts = pos.masked_fill(pos < 0, torch.iinfo(pos.dtype).max).amin(dim=1).tolist()  # [B]
        done = self._settled[layer_idx]
        together = len(set(zip(firsts, done))) == 1  # every row at the same point of its stream: one call
        for rows in ([slice(0, len(firsts))] if together else [slice(b, b + 1) for b in range(len(firsts))]):
            first, before = firsts[rows.start], done[rows.start]
            if first == torch.iinfo(pos.dtype).max:  # a row of padding only
                continue
            settled = self.quantizer.settle((keys if arrived is None else arrived)[rows], values[rows], k_pos[rows],
                                            group_id[rows], before, first)
            if arrived is not None and settled > before:
                rounded = ((k_pos[rows] >= before) & (k_pos[rows] < settled)).nonzero(as_tuple=True)
                slots = (rounded[0] + rows.start, *rounded[1:])
                offsets = layer.offsets[slots]
                self._rotate(layer, slots, offsets, self._tables_of(offsets, layer.keys))
            done[rows] = [settled] * len(done[rows])

    def _offsets_now(self, layer: LayerCache, q_pos: Tensor) -> Tensor:
        """Every key's offset for the queries at ``q_pos`` ([B, T]) now stored: ``k_rope + q_pos - q_rope``."""
        k_pos = layer.live()[2]
        q_rope, k_rope, _ = self._rope_positions(k_pos, q_pos)
        return k_rope + (q_pos - q_rope)[:, -1:, None] - k_pos

    @_no_grad
    def _place(self, layer: LayerCache, offset: Tensor) -> None:
        """Give every key of a layer the offset ``offset`` ([B, H_kv, S]); padding stays where it is."""
        k_pos = layer.live()[2]
        offset = torch.broadcast_to(offset, k_pos.shape).masked_fill(k_pos < 0, 0)
        moved = (offset != layer.offsets[:, :, : layer.length]).nonzero(as_tuple=True)
        wanted = offset[moved]
        self._rotate(layer, moved, wanted, self._tables_of(wanted, layer.keys))
        layer.placed = True

    def _tables_of(self, offsets: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
        """RoPE's tables for rotating keys by ``offsets`` ([M]), in float32 at least (float64 stays)."""

        return rope_tables(offsets[None, None], self.rope_theta, keys.shape[-1],
                           torch.promote_types(keys.dtype, torch.float32))

    @_no_grad
    def _rotate(self, layer: LayerCache, slots: tuple[Tensor, ...], offsets: Tensor,
                tables: tuple[Tensor, Tensor]) -> None:
        """Rotate the keys at ``slots`` (indices into [B, H_kv, S]) to ``offsets`` ([M]) beyond their original
        positions, from their originals, with ``tables = _tables_of(offsets)``."""

        if slots[0].numel() == 0:
            return
        arrived = layer.originals[slots]  # [M, d] (slots index the storage as well as its live part)
        placed = rope(arrived.to(tables[0].dtype)[None, None], offsets[None, None], self.rope_theta, tables)[0, 0]
        layer.keys[slots] = placed.to(layer.keys.dtype)
        layer.offsets[slots] = offsets

    # ----------------------------------------------------------------------------- what a layer attends with
    def rope_positions(self, layer_idx: int, q_pos: Tensor) -> tuple[Tensor, Tensor, SinkRotation | None]:
        """The RoPE positions a layer's queries at ``q_pos`` ([B, T]) and its cached keys would get now
        (for inspection; ``update`` hands them to the layer)."""
        return self._rope_positions(self.layers[layer_idx].live()[2], q_pos)

    def _rope_positions(self, k_pos: Tensor, q_pos: Tensor) -> tuple[Tensor, Tensor, SinkRotation | None]:
        """Positions the rotary embedding should use for the queries and the cached keys.

        Original rule: the true positions. Cache rule (StreamingLLM): a key's position is its
        rank among the cached keys (0..n-1) and each new query takes the rank of its own slot.

        One exception keeps the exact chunked evaluator exact under the cache rule: when several
        queries beyond the budget run at once as a stream chunk under a position-only policy, each
        query saw a different cache. Recent keys sit at their true distance from the query in every
        such cache; only the pinned sinks appear closer than they really are, as if the query stood
        at position ``budget - 1``. That case returns true positions plus a ``SinkRotation``.
        Returns (q_positions [B, T], k_positions [B, H_kv, S], SinkRotation or None).
        """
        if self.policy.position_rule == "original":
            return q_pos, k_pos, None
        n, t = k_pos.shape[-1], q_pos.shape[-1]
        budget = self.policy.budget
        if t > 1 and self._streamed() and budget is not None and n > budget:
            return q_pos, k_pos, SinkRotation(q_pos.clamp(max=budget - 1), self.policy.pinned(k_pos))
        ranks = self.policy.cache_ranks(k_pos)
        q_rank = torch.arange(n - t, n, device=q_pos.device).expand(q_pos.shape[0], t)
        return q_rank, ranks, None

    def _attention_mask(self, k_pos: Tensor, q_pos: Tensor) -> Tensor | None:
        """Which cached keys each query may see: [B, H_kv, T, S] bool, or None when all may.

        Causal by original position; for a stream chunk under a policy decided by positions alone,
        also restricted to the keys that would still be cached when that query was decoded alone.
        """
        if q_pos.shape[-1] == 1:
            return None
        qp = q_pos[:, None, :, None]
        kp = k_pos[:, :, None, :]
        mask = kp <= qp
        if self._streamed():
            mask = mask & self.policy.visible(qp, kp)
        return mask

    def _streamed(self) -> bool:
        """Do chunks of several tokens stand for a stream the decode loop would have evicted from?"""
        return self.chunks == "stream" and self.policy.is_static

    # ----------------------------------------------------------------------------- set-up for measurements
    @torch.no_grad()
    def fill(self, keys: Tensor, values: Tensor, positions: Tensor, seen: int,
             stats: dict[str, Tensor] | None = None) -> None:
        """Put every layer into a given state (benchmarks: the cost of a step depends on the slots, not
        on what they hold). keys, values: [B, H_kv, S, d]; positions: [B, S] original positions;
        ``seen``: tokens streamed so far; stats: optional per-slot numbers of the policy, name -> [B, H_kv, S]."""
        if any(layer.length for layer in self.layers):
            raise ValueError("fill needs an empty cache")
        if positions.shape[-1] and int(positions.max()) >= seen:
            raise ValueError(f"positions must be below seen={seen}, got up to {int(positions.max())}")
        for layer in self.layers:
            layer.append(keys.to(self.dtype), values.to(self.dtype), positions)
            for name, value in (stats or {}).items():
                layer.stat(name)[:] = value
        self.seen = seen
        for layer in self.layers:
            if layer.originals is not None:  # the keys count as arrived: placed where the policy puts them
                self._place(layer, self._offsets_after(layer))

    @torch.no_grad()
    def rewind(self, seen: int) -> None:
        """Forget every token from position ``seen`` on (timing one step again and again at one context).

        Only for caches that never evict (no budget): their slots are in stream order."""
        if self.policy.budget is not None or self.policy.prompt_budget is not None:
            raise ValueError(f"rewind needs a cache that never evicts; this one runs {self.policy.label}")
        if self.quantizer is not None:
            raise ValueError("rewind needs a cache in full precision: a quantized store has already rounded its tokens")
        if not 0 <= seen <= self.seen:
            raise ValueError(f"seen must be between 0 and {self.seen}, got {seen}")
        for layer in self.layers:
            layer.length = int((layer.positions[0, 0, : layer.length] < seen).sum())
            layer.positions[:, :, layer.length :] = -1
        self.seen = seen

    # ----------------------------------------------------------------------------- sizes
    @property
    def n_slots(self) -> int:
        """Slots in use in the fullest layer (tokens cached per KV head)."""
        return max(layer.length for layer in self.layers)

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values in use, at the cache's dtype (``bytes_at``)."""
        return self.bytes_at(torch.finfo(self.dtype).bits // 8)

    def bytes_at(self, dtype_bytes: int) -> int:
        """Bytes of keys and values in use if full-precision numbers took ``dtype_bytes`` each (e.g. 2: what a
        16-bit deployment holds, whatever the dtype this cache computes in): ``cache_bytes_per_token`` per slot of
        each layer and batch row; a quantized store: its codes, scales and full-precision tokens (``KIVI.nbytes``)."""
        _, b, h, d = self.shape
        if self.quantizer is not None:
            return sum(self.quantizer.nbytes(layer, dtype_bytes) for layer in self.layers)
        return b * cache_bytes_per_token(1, h, d, dtype_bytes) * sum(layer.length for layer in self.layers)

    @property
    def allocated_bytes(self) -> int:
        """Bytes the preallocated key/value storage occupies (>= nbytes), with the arrived keys a re-rotating
        cache keeps beside its keys."""
        return sum(layer.keys.nbytes + layer.values.nbytes + (0 if layer.originals is None else layer.originals.nbytes)
                   for layer in self.layers)

    def positions(self, layer_idx: int = 0) -> Tensor:
        """Original positions cached in a layer: [B, H_kv, S]."""
        return self.layers[layer_idx].live()[2]

    def __repr__(self) -> str:
        n, b, h, d = self.shape
        return (
            f"KVCache(layers={n}, batch={b}, kv_heads={h}, head_dim={d}, slots={self.n_slots}, "
            f"seen={self.seen}, policy={self.policy!r}, {self.nbytes / 2**20:.2f} MiB)"
        )


class CacheGroup:
    """Several caches fed by *one* forward pass over a prompt: the fair start of a comparison.

    Every member stores the same new keys and values (a prompt runs with full causal attention
    whatever the policy, so every member hands the layer the same view), and each member's policy
    reads the attention rows it asked for from the one set of weights the layer computed (the
    most rows any member wants). So every contender compresses literally the same computation,
    and a comparison of N policies costs one prompt forward instead of N.

    The model sees a group as one cache (``shape``, ``dtype``, ``seen``, ``update``, ``observe``,
    ``advance``). Only for prompts: a member that would evict during the forward (a single new
    token arriving at a full cache) would make the views differ, and is refused.
    """

    def __init__(self, caches: list[KVCache]) -> None:
        if not caches:
            raise ValueError("CacheGroup needs at least one cache")
        first = caches[0]
        for c in caches[1:]:
            if (c.shape, c.dtype, c.seen, c.rope_theta) != (first.shape, first.dtype, first.seen, first.rope_theta):
                raise ValueError(f"the caches of a group must have one shape, dtype, stream position and key rotation; "
                                 f"got {first!r} and {c!r}")
        if any(c.chunks != "prompt" for c in caches):
            raise ValueError("a CacheGroup shares a prompt forward: make its caches with chunks='prompt'")
        self.caches = caches
        self.shape, self.dtype, self.rope_theta = first.shape, first.dtype, first.rope_theta

    @property
    def seen(self) -> int:
        return self.caches[0].seen

    def update(self, layer_idx: int, k: Tensor, v: Tensor, pos: Tensor) -> AttentionView:
        """Store the new tokens in every member; return the view they share (with the most weight rows any
        member asked for)."""
        views = [c.update(layer_idx, k, v, pos) for c in self.caches]
        first = views[0]
        for view in views[1:]:
            same = (view.keys.shape == first.keys.shape and torch.equal(view.positions, first.positions)
                    and torch.equal(view.q_rope, first.q_rope) and torch.equal(view.k_rope, first.k_rope)
                    and view.sink_rotation is None and first.sink_rotation is None)
            if not same:
                raise ValueError("the caches of a group would attend differently (other slots or positions): a group "
                                 "can only share the forward of a prompt that starts every member alike")
        return AttentionView(first.keys, first.values, first.positions, first.mask,
                             max(view.weight_rows for view in views), first.n_queries, first.rope_positions)

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        return self.caches[0].rotate(x, pos)

    def observe(self, layer_idx: int, weights: Tensor | None) -> None:
        """Every member takes the last rows its own policy asked for."""
        for c in self.caches:
            c.observe(layer_idx, weights)

    def advance(self, n_tokens: int) -> None:
        for c in self.caches:
            c.advance(n_tokens)
