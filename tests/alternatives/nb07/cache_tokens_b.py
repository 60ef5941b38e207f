# A table of small rules (one lambda per policy), looked up by name; integers forced with int().

RULES = {
    "full": lambda b, p, g: p + g,
    "window": lambda b, p, g: min(b, p + g),
    "streaming": lambda b, p, g: min(b, p + g),
    "h2o": lambda b, p, g: min(b, p + g),
    "h2o-mean": lambda b, p, g: min(b, p + g),
    "snapkv": lambda b, p, g: min(b, p) + g,   # prompt compressed once, nothing evicted while decoding
}


def cache_tokens(policy, budget, prompt, generated):
    rule = RULES[policy]
    return int(rule(budget, prompt, generated))
