# A float copy of the positions with the sinks set to infinity in place.
import math


def streaming_scores(positions, seen, n_sink):
    scores = positions.double().clone()
    scores[positions < n_sink] = math.inf
    return scores
