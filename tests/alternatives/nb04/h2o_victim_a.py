# A plain loop over the slots, keeping the lowest score among the slots that may go.
def h2o_victim(scores, positions, seen, recent, n_sink=0):
    best, victim = None, None
    for slot in range(len(scores)):
        p = int(positions[slot])
        if p < n_sink or p >= seen - recent:
            continue
        if best is None or float(scores[slot]) < best:
            best, victim = float(scores[slot]), slot
    return victim
