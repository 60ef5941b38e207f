# Per layer, batch row and KV head in Python: the group's summed and pooled votes, the best prefix slots chosen
# with topk, the window appended, then one gather per layer.
import torch
import torch.nn.functional as F


@torch.inference_mode()
def snapkv_compress(model, prompt, capacity, window, kernel, pooling="max"):
    b, p = prompt.shape
    h, hkv = model.config.n_head, model.config.n_kv_head
    g = h // hkv
    cache = model.new_cache(batch=b)
    out = model(prompt, cache=cache, output_attentions=True)
    for layer, attn in zip(cache.layers, out.attentions):
        keep = torch.empty(b, hkv, capacity, dtype=torch.long)
        for row in range(b):
            for kv in range(hkv):
                votes = attn[row, kv * g:(kv + 1) * g, p - window:, : p - window].double().sum(dim=1)  # [G, P - w]
                pool = F.max_pool1d if pooling == "max" else (
                    lambda x, k, stride, padding: F.avg_pool1d(x, k, stride, padding, count_include_pad=False))
                votes = pool(votes[:, None], kernel, stride=1, padding=kernel // 2)[:, 0].mean(dim=0)
                best = votes.topk(capacity - window).indices
                keep[row, kv] = torch.cat([best, torch.arange(p - window, p)]).sort().values
        layer.gather(keep.to(prompt.device))
    return cache
