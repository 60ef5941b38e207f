# Zero the dropped weights and divide by what is left (softmax over a subset = renormalised weights).
def renormalise_without(weights, keep):
    kept = weights * keep.to(weights.dtype)
    return kept / kept.sum(dim=-1, keepdim=True)
