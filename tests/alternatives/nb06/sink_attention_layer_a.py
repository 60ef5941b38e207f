# einsum for scores and outputs; the sink logit as an extra key column; the future masked with tril.
import math

import torch


def sink_attention_layer(x, layer):
    b, t, dm = x.shape
    h = layer.n_head
    d = dm // h
    q, k, v = (z.reshape(b, t, h, d) for z in layer.qkv(x).chunk(3, dim=-1))    # [B, T, H, d]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
    s = s.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device)), -math.inf)
    sink = layer.sink_logit.reshape(1, h, 1, 1).expand(b, h, t, 1)
    w = torch.cat([s, sink], dim=-1).softmax(dim=-1)[..., :t]
    y = torch.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, t, dm)
    return layer.out(y)
