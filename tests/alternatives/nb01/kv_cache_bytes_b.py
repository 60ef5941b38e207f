# Built up from a helper: numbers per token of one sequence (K and V, all layers), then times tokens, batch and
# bytes, with math.prod.
import math


def numbers_per_token(n_layers, kv_heads, head_dim):
    return math.prod((2, n_layers, kv_heads, head_dim))


def kv_cache_bytes(n_layers, kv_heads, head_dim, tokens, batch=1, dtype_bytes=2):
    """Bytes of the KV cache of `batch` sequences of `tokens` tokens."""
    per_token = numbers_per_token(n_layers, kv_heads, head_dim) * dtype_bytes
    return int(per_token * tokens * batch)
