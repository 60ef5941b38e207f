# Sinks first; every later token counted from the first recent slot, modulo the window.
def rolling_slot(t, n_sink, window):
    if t < n_sink:
        return t
    return n_sink + (t - n_sink) % window
