# Total numbers first (if/else on the layout), then integer bytes; the scale and zero point counted per group of
# the token's numbers overall.
def kv_bytes_per_token(config, bits=16, group_size=None):
    """Bytes one token takes in the cache of `config` (all layers), `bits` bits per number."""
    layers = config["n_layers"]
    if "kv_heads" in config:
        numbers = 2 * layers * config["kv_heads"] * config["head_dim"]
    else:
        numbers = layers * (config["kv_lora_rank"] + config["rope_dim"])
    data = numbers * bits // 8
    if bits == 16:
        return data
    groups = numbers // group_size
    return data + groups * (2 + 2)
