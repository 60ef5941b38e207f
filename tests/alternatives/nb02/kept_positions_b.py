# A loop over every position so far, keeping those that are sinks or inside the window.
def kept_positions(t, window, n_sink):
    kept = []
    for p in range(t + 1):
        if p < n_sink or p > t - window:
            kept.append(p)
    return kept
