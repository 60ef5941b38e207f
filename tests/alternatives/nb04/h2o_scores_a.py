# Build the score, then pin the recent slots in place on a copy.
import math


def h2o_scores(acc, positions, seen, recent, mean=False):
    score = acc.clone()
    if mean:
        queries = (seen - positions).clamp(min=1)
        score = score / queries
    score[positions >= seen - recent] = math.inf
    return score
