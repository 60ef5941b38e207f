# Set union of the sinks and the window (overlap removed), returned as a sorted list.
def kept_positions(t, window, n_sink):
    sinks = set(range(min(n_sink, t + 1)))
    recent = set(range(max(0, t - window + 1), t + 1))
    return sorted(sinks | recent)
