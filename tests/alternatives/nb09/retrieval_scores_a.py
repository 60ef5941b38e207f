# Loops over trials, layers and answer tokens; argmax of each head's row, hits counted into an [L, H] float32 tensor.
import torch


def retrieval_scores(model, trials):
    total = None
    for trial in trials:
        prompt = trial.prompt[0]
        ids = torch.cat([prompt, trial.answer])
        lo, hi = trial.needle
        P, A = prompt.shape[0], trial.answer.shape[0]
        with torch.no_grad():
            attentions = model(ids[None].to(model.device), output_attentions=True).attentions
        hits = torch.zeros(len(attentions), attentions[0].shape[1])
        for layer, attn in enumerate(attentions):
            for i in range(P, P + A):
                top = attn[0, :, i - 1].argmax(dim=-1).cpu()            # [H]
                inside = (top >= lo) & (top < hi)
                same = ids[top] == ids[i]
                hits[layer] += (inside & same).float()
        scores = hits / A
        total = scores if total is None else total + scores
    return total / len(trials)
