# Simulate the buffer: the first slots fill in order, then the recent slots take turns.
def rolling_slot(t, n_sink, window):
    slot = 0
    for token in range(t + 1):
        if token < n_sink + window:
            slot = token
        else:
            slot = slot + 1 if slot + 1 < n_sink + window else n_sink
    return slot
