"""Bytes per token of a KV cache, for the cache layouts and number formats of current models.

* Multi-head (MHA), grouped-query (GQA) and multi-query (MQA, one KV head) attention cache a key
  and a value per KV head: 2 x L x H_kv x d numbers per token (``course.kvcache.cache_bytes_per_token``).
* Multi-head latent attention (MLA, DeepSeek-V2) caches, per token and layer, one compressed latent
  of ``kv_lora_rank`` numbers from which every head's key and value are re-projected, plus one
  decoupled RoPE key of ``rope_dim`` numbers shared by the heads: L x (d_c + d_rope) numbers.
* A quantised cache stores each number in ``bits`` bits and, for every group of ``group_size``
  consecutive numbers of a token's vector, a scale and a zero point (``scale_bytes`` each, float16).

A configuration is a plain dict: ``{"n_layers", "kv_heads", "head_dim"}`` (MHA/GQA/MQA, optionally
``"n_heads"``, the query heads, which the cache does not depend on) or ``{"n_layers", "kv_lora_rank",
"rope_dim"}`` (MLA).
"""

from __future__ import annotations

from course.kvcache import cache_bytes_per_token

__all__ = ["CONFIGS", "cache_numbers_per_token", "vector_length", "kv_bytes_per_token"]

# Published configurations. Sources: each model's config.json on the Hugging Face Hub
# (num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size / heads; Falcon's
# multi_query: true means one KV head; DeepSeek-V2's kv_lora_rank and qk_rope_head_dim) and
# DeepSeek-V2's paper (arXiv:2405.04434, section 2.1: the MLA cache is (d_c + d_h^R) x l numbers per token).
CONFIGS: dict[str, dict] = {
    "GPT-2 (124M, MHA)": {"n_layers": 12, "n_heads": 12, "kv_heads": 12, "head_dim": 64},
    "SmolLM2-135M (GQA 9:3)": {"n_layers": 30, "n_heads": 9, "kv_heads": 3, "head_dim": 64},
    "Llama-2-7B (MHA)": {"n_layers": 32, "n_heads": 32, "kv_heads": 32, "head_dim": 128},
    "Llama-3-8B (GQA 32:8)": {"n_layers": 32, "n_heads": 32, "kv_heads": 8, "head_dim": 128},
    "Mistral-7B (GQA 32:8)": {"n_layers": 32, "n_heads": 32, "kv_heads": 8, "head_dim": 128},
    "Falcon-7B (MQA 71:1)": {"n_layers": 32, "n_heads": 71, "kv_heads": 1, "head_dim": 64},
    "DeepSeek-V2 (MLA)": {"n_layers": 60, "kv_lora_rank": 512, "rope_dim": 64},
}

_HEADS = ("n_layers", "kv_heads", "head_dim")
_LATENT = ("n_layers", "kv_lora_rank", "rope_dim")


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _field(config: dict, key: str) -> int:
    return _positive(f"config[{key!r}]", config[key])


def _layout(config: dict) -> tuple[str, ...]:
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    for keys in (_LATENT, _HEADS):
        if all(k in config for k in keys):
            return keys
    raise ValueError(f"config must have the keys {', '.join(_HEADS)} (MHA/GQA/MQA) or {', '.join(_LATENT)} (MLA); "
                     f"got {', '.join(sorted(config))}")


def vector_length(config: dict) -> int:
    """Numbers of one cached vector: head_dim (a key or a value) or kv_lora_rank + rope_dim (an MLA entry)."""
    layout = _layout(config)
    if layout == _LATENT:
        return _field(config, "kv_lora_rank") + _field(config, "rope_dim")
    return _field(config, "head_dim")


def cache_numbers_per_token(config: dict) -> int:
    """Numbers one token occupies in the cache, all layers together."""
    layout = _layout(config)
    layers = _field(config, "n_layers")
    if layout == _LATENT:
        return layers * vector_length(config)  # one latent + one RoPE key per layer, no separate K and V
    return cache_bytes_per_token(layers, _field(config, "kv_heads"), vector_length(config), 1)


def kv_bytes_per_token(config: dict, bits: int = 16, group_size: int | None = None, scale_bytes: int = 2) -> int:
    """Bytes one token occupies in the cache.

    bits: 32 or 16 (floating point, no overhead), 8 or 4 (quantised: needs ``group_size``, which must
    divide the cached vector's length; each group adds a scale and a zero point of ``scale_bytes``).
    """
    numbers = cache_numbers_per_token(config)
    if bits in (32, 16):
        return numbers * bits // 8
    if bits not in (8, 4):
        raise ValueError(f"bits must be 32, 16, 8 or 4, got {bits!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer for a {bits}-bit cache, got {group_size!r}")
    if vector_length(config) % group_size:
        raise ValueError(f"group_size must divide the cached vector's length ({vector_length(config)}), "
                         f"got {group_size}")
    _positive("scale_bytes", scale_bytes)
    return numbers * bits // 8 + numbers // group_size * 2 * scale_bytes
