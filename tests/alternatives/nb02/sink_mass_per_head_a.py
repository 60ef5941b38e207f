# Vectorised: slice the queries from `skip` on and the first `k` keys, sum over keys, mean over queries.
def sink_mass_per_head(attn, k=1, skip=4):
    """attn: [H, T, T] -> [H]"""
    return attn[:, skip:, :k].sum(dim=-1).mean(dim=-1)
