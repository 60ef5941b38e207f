# The sink written into the denominator by hand (a stable exponential), one head at a time, heads concatenated.
import torch


def sink_attention_layer(x, layer):
    b, t, dm = x.shape
    h = layer.n_head
    d = dm // h
    qkv = layer.qkv(x)
    visible = torch.ones(t, t, device=x.device).tril().bool()
    heads = []
    for i in range(h):
        q = qkv[..., i * d:(i + 1) * d]
        k = qkv[..., dm + i * d: dm + (i + 1) * d]
        v = qkv[..., 2 * dm + i * d: 2 * dm + (i + 1) * d]
        s = (q @ k.transpose(1, 2)) / d**0.5
        s = torch.where(visible, s, torch.full_like(s, float("-inf")))
        top = torch.maximum(s.amax(-1, keepdim=True), layer.sink_logit[i])
        e = (s - top).exp()
        w = e / (e.sum(-1, keepdim=True) + (layer.sink_logit[i] - top).exp())
        heads.append(w @ v)
    return layer.out(torch.cat(heads, dim=-1))
