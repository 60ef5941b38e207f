# Vectorised: all layers stacked into [L, H, T, T], the answer-producing rows sliced at once, max(...).indices for
# the keys, per-trial scores stacked and averaged in float64.
import torch


def retrieval_scores(model, trials):
    per_trial = []
    for t in trials:
        ids = torch.cat([t.prompt[0], t.answer]).to(model.device)
        n_prompt, n_answer = t.prompt.shape[1], t.answer.numel()
        with torch.inference_mode():
            maps = torch.stack(model(ids.unsqueeze(0), output_attentions=True).attentions)[:, 0]   # [L, H, T, T]
        rows = maps[:, :, n_prompt - 1 : n_prompt + n_answer - 1]          # [L, H, A, T]
        key = rows.max(dim=-1).indices                                    # [L, H, A]
        wanted = ids[n_prompt:]                                           # [A]
        lo, hi = t.needle
        hit = (key >= lo) & (key < hi) & (ids[key] == wanted)
        per_trial.append(hit.double().mean(dim=-1).cpu())
    return torch.stack(per_trial).mean(dim=0)
