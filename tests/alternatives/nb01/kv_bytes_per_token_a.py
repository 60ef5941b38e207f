# Counts cached vectors and their length per layout; quantised: ceil(groups per vector) of 2 x 2 bytes each, the
# numbers at bits / 8 bytes (true division, rounded back to an int).
import math


def _vectors(config):
    """(vectors cached per token and layer, numbers in each)."""
    if "kv_lora_rank" in config:
        return 1, config["kv_lora_rank"] + config["rope_dim"]
    return 2 * config["kv_heads"], config["head_dim"]


def kv_bytes_per_token(config, bits=16, group_size=None):
    """Bytes one token takes in the cache of `config` (all layers), `bits` bits per number."""
    count, length = _vectors(config)
    per_vector = length * bits / 8
    if bits < 16 and group_size:
        per_vector += math.ceil(length / group_size) * 2 * 2
    return int(round(config["n_layers"] * count * per_vector))
