"""What a cache costs, computed from a model's shapes: bytes per cached token, bytes of activations per prompt token
during a prefill, and the longest prompt that fits a memory."""

from __future__ import annotations

__all__ = ["cache_bytes_per_token", "prefill_bytes_per_token", "longest_prompt"]


def cache_bytes_per_token(n_layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes one token occupies in the cache: 2 (K and V) * L * H_kv * d * bytes per number."""
    return 2 * n_layers * kv_heads * head_dim * dtype_bytes


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
