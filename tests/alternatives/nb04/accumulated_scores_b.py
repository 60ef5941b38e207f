# einsum over the queries, then the group mean through a view.
import torch


def accumulated_scores(attn, kv_heads):
    per_head = torch.einsum("hqk->hk", attn)
    return per_head.view(kv_heads, -1, per_head.shape[-1]).mean(dim=1)
