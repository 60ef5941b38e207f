# unflatten the head dimension into (kv_heads, group) and take the max over the group.
def kv_head_scores(scores, kv_heads):
    return scores.unflatten(1, (kv_heads, -1)).max(dim=-1).values
