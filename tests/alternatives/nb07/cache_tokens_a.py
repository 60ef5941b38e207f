# An if-chain over the policy names: the bounded ones hold min(budget, everything seen); SnapKV compresses
# the prompt once and keeps every generated token after it.


def cache_tokens(policy, budget, prompt, generated):
    total = prompt + generated
    if policy == "full":
        return total
    if policy in ("window", "streaming", "h2o", "h2o-mean"):
        return min(budget, total)
    if policy == "snapkv":
        return min(budget, prompt) + generated
    raise ValueError(f"unknown policy {policy!r}")
