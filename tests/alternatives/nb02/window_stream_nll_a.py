# The loop as described: gather sinks + the last window - 1 slots when full, feed, NLL = logsumexp - target logit,
# steps stacked along dim 1 (the model's dtype).
import torch


@torch.inference_mode()
def window_stream_nll(model, ids, window, n_sink=0):
    B, T = ids.shape
    cache = model.new_cache(batch=B)
    steps = []
    for t in range(T - 1):
        n = cache.layers[0].length
        if n >= n_sink + window:
            index = torch.cat([torch.arange(n_sink), torch.arange(n - window + 1, n)]).to(ids.device)
            for layer in cache.layers:
                layer.gather(index.expand(B, layer.keys.shape[1], -1))
        logits = model(ids[:, t:t + 1], cache=cache).logits[:, -1]
        target = ids[:, t + 1]
        steps.append(torch.logsumexp(logits, dim=-1) - logits.gather(1, target[:, None])[:, 0])
    return torch.stack(steps, dim=1)
