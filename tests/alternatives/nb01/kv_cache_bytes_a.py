# The formula written out as one product of plain ints.
def kv_cache_bytes(n_layers, kv_heads, head_dim, tokens, batch=1, dtype_bytes=2):
    """Bytes of the KV cache of `batch` sequences of `tokens` tokens."""
    return 2 * n_layers * kv_heads * head_dim * tokens * batch * dtype_bytes
