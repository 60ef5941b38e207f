# Plain loops with Python numbers: for each trial, layer, head and answer token, count the copies.
import torch


def retrieval_scores(model, trials):
    sums = None
    for trial in trials:
        ids = torch.cat([trial.prompt[0], trial.answer])
        out = model(ids[None].to(model.device), output_attentions=True)
        maps = [a[0].detach().cpu() for a in out.attentions]                # per layer [H, T, T]
        if sums is None:
            sums = [[0.0] * maps[0].shape[0] for _ in maps]
        first, (lo, hi) = trial.prompt.shape[1], trial.needle
        answer = list(range(first, len(ids)))
        for layer, attn in enumerate(maps):
            for head in range(attn.shape[0]):
                copies = 0
                for i in answer:
                    key = int(attn[head, i - 1].argmax())
                    copies += lo <= key < hi and int(ids[key]) == int(ids[i])
                sums[layer][head] += copies / len(answer)
    return torch.tensor(sums, dtype=torch.float64) / len(trials)
