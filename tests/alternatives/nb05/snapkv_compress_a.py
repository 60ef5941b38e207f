# Pooling with unfold over a padded row (-inf for max; for avg a sum over a count of real positions), the group
# mean through a view, and the kept slots as one sorted index per KV head.
import torch
import torch.nn.functional as F


def _pool(x, kernel, pooling):
    r = kernel // 2
    if pooling == "max":
        return F.pad(x, (r, r), value=float("-inf")).unfold(-1, kernel, 1).amax(dim=-1)
    total = F.pad(x, (r, r)).unfold(-1, kernel, 1).sum(dim=-1)
    count = F.pad(torch.ones_like(x), (r, r)).unfold(-1, kernel, 1).sum(dim=-1)
    return total / count


@torch.no_grad()
def snapkv_compress(model, prompt, capacity, window, kernel, pooling="max"):
    b, p = prompt.shape
    h, hkv = model.config.n_head, model.config.n_kv_head
    cache = model.new_cache(batch=b)
    maps = model(prompt, cache=cache, output_attentions=True).attentions
    for layer, attn in zip(cache.layers, maps):
        votes = torch.einsum("bhwk->bhk", attn[:, :, p - window:, : p - window].double())   # [B, H, P - w]
        votes = _pool(votes, kernel, pooling).view(b, hkv, h // hkv, p - window).mean(dim=2)
        best = votes.argsort(dim=-1, descending=True)[..., : capacity - window]
        window_slots = torch.arange(p - window, p, device=best.device).expand(b, hkv, window)
        layer.gather(torch.cat([best, window_slots], dim=-1).sort(dim=-1).values)
    return cache
