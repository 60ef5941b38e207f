# Plain Python: a list of (score, head) for the slots left after every head's safeguard, sorted, counted.
def adakv_counts(scores, budget, safeguard):
    h, s = scores.shape
    safe = max(1, int(budget * safeguard))
    counts = [safe] * h
    rest = []
    for head in range(h):
        row = sorted(scores[head].tolist(), reverse=True)
        rest.extend((value, head) for value in row[safe:])
    rest.sort(reverse=True)
    for _, head in rest[: h * budget - h * safe]:
        counts[head] += 1
    return counts
