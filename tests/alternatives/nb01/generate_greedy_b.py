# The output is preallocated and filled in place; one loop feeds the prompt first, then each new token,
# and takes the argmax of the last position with torch.max.
import torch


@torch.inference_mode()
def generate_greedy(model, prompt, n_new):
    b, p = prompt.shape
    out = torch.empty(b, p + n_new, dtype=prompt.dtype, device=prompt.device)
    out[:, :p] = prompt
    cache = model.new_cache(batch=b)
    feed = prompt
    for t in range(p, p + n_new):
        last = model(feed, cache=cache).logits[:, -1]
        out[:, t] = torch.max(last, dim=-1).indices
        feed = out[:, t:t + 1]
    return out
