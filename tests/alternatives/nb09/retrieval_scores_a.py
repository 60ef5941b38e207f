# Vectorised over layers, heads and answer tokens: the rows of the queries that produce the answer, their argmax,
# and one boolean test for "inside the needle and the same token".
import torch


def retrieval_scores(model, trials):
    total = None
    for trial in trials:
        ids = torch.cat([trial.prompt[0], trial.answer]).to(model.device)
        with torch.no_grad():
            maps = torch.stack([a[0] for a in model(ids[None], output_attentions=True).attentions])  # [L, H, T, T]
        p, n = trial.prompt.shape[1], trial.answer.shape[0]
        top = maps[:, :, p - 1:p - 1 + n].argmax(dim=-1)                     # [L, H, A]
        lo, hi = trial.needle
        hit = (top >= lo) & (top < hi) & (ids[top] == ids[p:p + n])
        score = hit.double().mean(dim=-1).cpu()                              # [L, H]
        total = score if total is None else total + score
    return total / len(trials)
