# Tokens collected in a Python list; every new token is fed to the cache as soon as it is chosen, the last one too
# (one forward more than needed, the same ids).
import torch


@torch.inference_mode()
def generate_greedy(model, prompt, n_new):
    cache = model.new_cache(batch=prompt.shape[0])
    logits = model(prompt, cache=cache).logits
    new = []
    for _ in range(n_new):
        token = torch.argmax(logits[:, -1], dim=-1).unsqueeze(1)
        new.append(token)
        logits = model(token, cache=cache).logits
    return torch.cat([prompt, *new], dim=1)
