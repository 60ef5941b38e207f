# PyTorch's scaled_dot_product_attention (causal) for the attention, then the gate from the layer's input.
import torch
import torch.nn.functional as F


def gated_attention_layer(x, layer):
    b, t, dm = x.shape
    h = layer.n_head
    q, k, v = (z.view(b, t, h, dm // h).transpose(1, 2) for z in layer.qkv(x).split(dm, dim=-1))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)              # [B, H, T, d]
    y = y.transpose(1, 2).reshape(b, t, dm)
    return layer.out(y * torch.sigmoid(layer.gate(x)))
