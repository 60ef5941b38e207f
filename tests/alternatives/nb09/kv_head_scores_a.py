# A view into [L, H_kv, G] and amax over the group dimension.


def kv_head_scores(scores, kv_heads):
    L, H = scores.shape
    return scores.reshape(L, kv_heads, H // kv_heads).amax(dim=-1)
