# One pass keeping the best row so far; a strictly better metric or an equal one with a smaller cache replaces it
# (so among rows equal in both, the first wins). Raises when no row fits.


def choose_policy(rows, metric, max_tokens, higher_is_better):
    best = None
    for r in rows:
        if r["tokens"] > max_tokens:
            continue
        if best is None:
            best = r
            continue
        better = r[metric] > best[metric] if higher_is_better else r[metric] < best[metric]
        tie = r[metric] == best[metric] and r["tokens"] < best["tokens"]
        if better or tie:
            best = r
    if best is None:
        raise ValueError(f"no policy fits in {max_tokens} tokens")
    return best["policy"]
