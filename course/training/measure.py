"""What a trained tiny model is asked: how much attention rests on its sink or on position 0, and what a
rolling cache costs it (``window_losses``); the copy head of Bigram-Backcopy (``copy_head_profile``)."""

from __future__ import annotations

import torch
from torch import Tensor

from course.policies import make_policy
from course.streaming import exact_stream
from course.training.tasks import BigramBackcopy, lm_loss, make_task
from course.training.variants import TrainRun

__all__ = ["attention_on_sink", "attention_on_first", "uniform_first", "sink_mass_of", "window_losses",
           "copy_head_profile"]


@torch.inference_mode()
def attention_on_sink(run: TrainRun, x: Tensor, skip: int = 4) -> Tensor:
    """Attention share each (layer, head) gives to its resting place: [layers, heads].

    For the sink-logit variants, the share of the empty slot (1 - the weights on real keys);
    otherwise the weight on position 0 (the sink token, or the first content token). Queries
    before ``skip`` are left out."""
    out = run.model(run.inputs(x), output_attentions=True)
    rows = []
    for w in out.attentions:  # [B, H, N, N]
        w = w[:, :, skip:]
        share = 1 - w.sum(-1) if run.model.config.sink_logit != "none" else w[..., 0]
        rows.append(share.mean(dim=(0, 2)))
    return torch.stack(rows)


@torch.inference_mode()
def attention_on_first(run: TrainRun, x: Tensor, skip: int = 4) -> Tensor:
    """Attention weight each (layer, head) puts on input position 0, whatever the variant: [layers, heads].

    Position 0 is the sink token, the BOS token or the first content token. Queries before ``skip``
    are left out (compare with ``uniform_first(run.inputs(x).shape[1], skip)``)."""
    out = run.model(run.inputs(x), output_attentions=True)
    return torch.stack([w[:, :, skip:, 0].mean(dim=(0, 2)) for w in out.attentions])


def uniform_first(n_tokens: int, skip: int = 4) -> float:
    """The weight on position 0 if every query from ``skip`` to ``n_tokens - 1`` attended uniformly
    to the keys it may see (query q sees q + 1 keys), averaged over those queries."""
    if not 0 <= skip < n_tokens:
        raise ValueError(f"skip must be in [0, n_tokens), got skip={skip}, n_tokens={n_tokens}")
    return sum(1 / (q + 1) for q in range(skip, n_tokens)) / (n_tokens - skip)


def sink_mass_of(run: TrainRun, x: Tensor) -> float:
    """Mean over layers and heads of ``attention_on_sink``."""
    return float(attention_on_sink(run, x).mean())


@torch.inference_mode()
def window_losses(run: TrainRun, x: Tensor, windows: list[int], sinks: list[int]) -> dict:
    """Held-out loss (nats per content token) with a rolling cache of ``k`` kept first slots +
    ``W`` recent tokens (positions inside the cache), for every W and k; and with full attention.

    x: [B, T] content tokens. The kept first slots are the first tokens of the model's input:
    the sink token (then content) for the sink-token variant, content otherwise.
    Returns {"full": loss, "windows": {W: {k: loss}}}.
    """
    inputs = run.inputs(x)
    n_prefix = run.n_prefix
    full = lm_loss(run.model(inputs).logits, inputs, n_prefix).item()
    table: dict[int, dict[int, float]] = {}
    for w in windows:
        table[w] = {}
        for k in sinks:
            policy = make_policy("streaming", k + w, sinks=k, model=run.model)
            r = exact_stream(run.model, inputs, policy, progress=False)
            table[w][k] = r.nll[:, max(n_prefix, 1) - 1 :].mean().item()
    return {"full": full, "windows": table}


@torch.inference_mode()
def copy_head_profile(run: TrainRun, x: Tensor) -> dict:
    """Find the copy head and how it behaves (Bigram-Backcopy only).

    For every (layer, head): ``active`` = mean attention, at queries whose next token is a copy,
    on the token to copy (two back); ``dormant`` = mean attention on the resting place at the
    other queries. Returns both as [layers, heads] and the (layer, head) with the highest active score.
    """
    task = make_task(run.config.task)
    if not isinstance(task, BigramBackcopy):
        raise ValueError("copy_head_profile needs the bigram-backcopy task")
    out = run.model(run.inputs(x), output_attentions=True)
    n_prefix = run.n_prefix
    is_copy = task.copy_targets(x.cpu())  # [B, T] over content positions
    # query at input position q predicts content token q + 1 - n_prefix; copy source is content q - 1
    b_idx, t_idx = is_copy[:, 2:].nonzero(as_tuple=True)
    t_idx = t_idx + 2  # content position of the copied token
    q = t_idx - 1 + n_prefix  # the query that predicts it
    src = t_idx - 2 + n_prefix  # the token it copies
    rest = ~is_copy
    rest[:, :4] = False
    rb, rt = rest[:, : x.shape[1] - 1].nonzero(as_tuple=True)
    rq = (rt - 1 + n_prefix).clamp(min=0)
    active_rows, dormant_rows = [], []
    for w in out.attentions:
        w = w.cpu()
        active = w[b_idx, :, q, src].mean(0)  # [H]
        if run.model.config.sink_logit != "none":
            dormant = (1 - w[rb, :, rq].sum(-1)).mean(0)
        else:
            dormant = w[rb, :, rq, 0].mean(0)
        active_rows.append(active)
        dormant_rows.append(dormant)
    active, dormant = torch.stack(active_rows), torch.stack(dormant_rows)
    best = divmod(int(active.argmax()), active.shape[1])
    return {"active": active, "dormant": dormant, "copy_head": best}
