# Preallocated per-layer key/value buffers written in place; GQA by grouping the query heads ([B, H_kv, G, d])
# with einsum (no copy of K/V); scores and softmax in float64; ids and logits preallocated.
import math

import torch
from course.models.llama import rope


class OwnCache:
    def __init__(self, n_layers, b, hkv, n, d, dtype, device):
        self.k = [torch.zeros(b, hkv, n, d, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(b, hkv, n, d, dtype=dtype, device=device) for _ in range(n_layers)]


def _attend(q, K, V):
    """q [B, H, 1, d]; K, V [B, H_kv, S, d] -> [B, H, 1, d]."""
    b, h, _, d = q.shape
    hkv = K.shape[1]
    qg = q.reshape(b, hkv, h // hkv, d).double()
    scores = torch.einsum("bkgd,bksd->bkgs", qg, K.double()) / math.sqrt(d)
    w = torch.softmax(scores, dim=-1)
    y = torch.einsum("bkgs,bksd->bkgd", w, V.double())
    return y.reshape(b, h, 1, d).to(q.dtype)


@torch.inference_mode()
def greedy_own_attention(model, prompt, n_new):
    cfg = model.config
    b, p = prompt.shape
    h, hkv, d = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    steps = p + n_new - 1
    cache = OwnCache(len(model.blocks), b, hkv, max(steps, 1), d, model.dtype, prompt.device)
    ids = torch.zeros(b, p + n_new, dtype=prompt.dtype, device=prompt.device)
    ids[:, :p] = prompt
    out = torch.zeros(b, steps, cfg.vocab_size, dtype=model.dtype, device=prompt.device)
    for t in range(steps):
        pos = torch.tensor([[t]] * b, device=prompt.device)
        x = model.tok_emb(ids[:, t:t + 1])
        for i, block in enumerate(model.blocks):
            attn = block.attn
            z = block.norm1(x)
            q = rope(attn.q(z).view(b, 1, h, d).transpose(1, 2), pos, cfg.rope_theta)
            k = rope(attn.k(z).view(b, 1, hkv, d).transpose(1, 2), pos, cfg.rope_theta)
            cache.k[i][:, :, t] = k[:, :, 0]
            cache.v[i][:, :, t] = attn.v(z).view(b, hkv, d)
            y = _attend(q, cache.k[i][:, :, :t + 1], cache.v[i][:, :, :t + 1])
            x = x + attn.o(y.transpose(1, 2).reshape(b, 1, h * d))
            x = x + block.mlp(block.norm2(x))
        out[:, t] = model.lm_head(model.norm(x))[:, 0]
        if t + 1 >= p:
            ids[:, t + 1] = out[:, t].argmax(-1)
    return ids, out
