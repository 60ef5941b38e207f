# Prefill once, then a loop that appends each argmax with torch.cat and feeds it; the last new token is not fed
# (its logits are not needed).
import torch


@torch.inference_mode()
def generate_greedy(model, prompt, n_new):
    cache = model.new_cache(batch=prompt.shape[0])
    logits = model(prompt, cache=cache).logits
    ids = prompt
    for i in range(n_new):
        nxt = logits[:, -1, :].argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        if i < n_new - 1:
            logits = model(nxt, cache=cache).logits
    return ids
