# Every layer drops exactly slot n_sink (the oldest after the sinks: slots are in stream order) via a boolean mask
# over its own slots; log_softmax in float64 into a preallocated float64 result; only the last logits kept.
import torch
import torch.nn.functional as F


def _drop_oldest_after_sinks(cache, n_sink, limit):
    for layer in cache.layers:
        n = layer.length
        if n < limit:
            continue
        slots = torch.arange(n, device=layer.keys.device)
        index = slots[slots != n_sink]
        b, hkv = layer.keys.shape[:2]
        layer.gather(index[None, None, :].repeat(b, hkv, 1))


@torch.inference_mode()
def window_stream_nll(model, ids, window, n_sink=0):
    B, T = ids.shape
    cache = model.new_cache(batch=B)
    nll = torch.empty(B, T - 1, dtype=torch.float64, device=ids.device)
    for t in range(T - 1):
        _drop_oldest_after_sinks(cache, n_sink, n_sink + window)
        logits = model(ids[:, t:t + 1], cache=cache, logits_to_keep=1).logits[:, 0]
        logp = F.log_softmax(logits.double(), dim=-1)
        nll[:, t] = -logp[torch.arange(B), ids[:, t + 1]]
    return nll
