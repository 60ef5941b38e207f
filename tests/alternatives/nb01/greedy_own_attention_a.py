# Per layer a Python list of [B, H_kv, 1, d] tensors concatenated at every step; GQA by repeat_interleave;
# logits collected in a list and concatenated at the end; the token embedding read from model.tok_emb.
import math

import torch
from course.models.llama import rope


def _block_step(block, x, keys, values, t, cfg):
    b = x.shape[0]
    h, hkv, d = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    z = block.norm1(x)
    q = block.attn.q(z).view(b, 1, h, d).transpose(1, 2)
    k = block.attn.k(z).view(b, 1, hkv, d).transpose(1, 2)
    v = block.attn.v(z).view(b, 1, hkv, d).transpose(1, 2)
    pos = torch.full((b, 1), t, dtype=torch.long, device=x.device)
    q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
    keys.append(k)
    values.append(v)
    K = torch.cat(keys, dim=2).repeat_interleave(h // hkv, dim=1)
    V = torch.cat(values, dim=2).repeat_interleave(h // hkv, dim=1)
    w = torch.softmax(q @ K.transpose(-1, -2) / math.sqrt(d), dim=-1)
    y = (w @ V).transpose(1, 2).reshape(b, 1, h * d)
    x = x + block.attn.o(y)
    return x + block.mlp(block.norm2(x))


@torch.inference_mode()
def greedy_own_attention(model, prompt, n_new):
    cfg = model.config
    keys = [[] for _ in model.blocks]
    values = [[] for _ in model.blocks]
    ids = prompt
    rows = []
    n_prompt = prompt.shape[1]
    for t in range(n_prompt + n_new - 1):
        x = model.tok_emb(ids[:, t:t + 1])
        for i, block in enumerate(model.blocks):
            x = _block_step(block, x, keys[i], values[i], t, cfg)
        logits = model.lm_head(model.norm(x))          # [B, 1, vocab]
        rows.append(logits)
        if t >= n_prompt - 1:
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids, torch.cat(rows, dim=1)
