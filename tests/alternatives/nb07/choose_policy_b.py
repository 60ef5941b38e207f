# Filter, then sort by (metric with its sign, tokens) and take the end of the list: among rows equal in metric and
# tokens the last one wins (a different but allowed tie-break).


def choose_policy(rows, metric, max_tokens, higher_is_better):
    fits = [r for r in rows if r["tokens"] <= max_tokens]
    if not fits:
        raise ValueError("nothing fits")
    sign = 1 if higher_is_better else -1
    ranked = sorted(fits, key=lambda r: (sign * r[metric], -r["tokens"]))
    return ranked[-1]["policy"]
