# einsum attention with an additive -inf mask; the gate computed first, as 1 / (1 + exp(-z)).
import math

import torch


def gated_attention_layer(x, layer):
    b, t, dm = x.shape
    h = layer.n_head
    d = dm // h
    gate = 1 / (1 + torch.exp(-layer.gate(x)))                                # [B, T, D]
    q, k, v = (z.reshape(b, t, h, d) for z in layer.qkv(x).chunk(3, dim=-1))
    mask = torch.full((t, t), -math.inf, device=x.device).triu(1)
    w = (torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d) + mask).softmax(-1)
    y = torch.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, t, dm)
    return layer.out(y * gate)
