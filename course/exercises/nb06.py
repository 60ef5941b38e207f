"""Notebook 06 (training a sink token): references and checkers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close
from course.train import lm_loss, prepend_sink


@exercise("06.prepend_sink", "Exercise 1 (prepend the sink token)", prepend_sink)
def _check_prepend(fn) -> None:
    x = torch.tensor([[5, 6, 7], [8, 9, 10]])
    got = fn(x.clone(), 64)
    want = prepend_sink(x, 64)
    if isinstance(got, Tensor) and torch.equal(got, want):
        return
    got = torch.as_tensor(got)
    if got.shape == (2, 4) and torch.equal(got[:, :3], x) and bool((got[:, 3] == 64).all()):
        raise Wrong("the sink goes in *front* of every sample, not at the end")
    if got.shape == (1, 3) or got.shape == (3, 3):
        raise Wrong("add one column (the sink) to every sample: [B, T] -> [B, T + 1], along dim 1")
    if got.shape == (2, 3):
        raise Wrong("keep every content token and add the sink: the result has T + 1 tokens")
    raise Wrong(f"expected {want.tolist()}, got {got.tolist()}")


@exercise("06.lm_loss", "Exercise 2 (never predict the sink)", lm_loss)
def _check_loss(fn) -> None:
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 10, (3, 7), generator=g)
    logits = torch.randn(3, 7, 11, generator=g)
    for n_prefix in (1, 0):
        got, want = fn(logits, inputs, n_prefix), lm_loss(logits, inputs, n_prefix)
        if close(got, want, 1e-5):
            continue
        aligned = F.cross_entropy(logits.reshape(-1, 11), inputs.reshape(-1))
        if close(got, aligned, 1e-5):
            raise Wrong("position i predicts token i + 1: shift the targets by one")
        with_sink = F.cross_entropy(logits[:, :-1].reshape(-1, 11), inputs[:, 1:].reshape(-1))
        if n_prefix == 1 and close(got, F.cross_entropy(logits[:, 1:-1].reshape(-1, 11), inputs[:, 2:].reshape(-1)), 1e-5):
            raise Wrong("the first content token is a target too: it is predicted from the sink's position")
        if n_prefix == 0 and close(got, F.cross_entropy(logits[:, 1:-1].reshape(-1, 11), inputs[:, 2:].reshape(-1)), 1e-5):
            raise Wrong("with n_prefix = 0 there is no sink: every token but the first is a target")
        if n_prefix == 1 and not close(got, with_sink, 1e-5):
            raise Wrong("the sink token (input position 0) must never be a target; every content token must be")
        raise Wrong(f"n_prefix={n_prefix}: expected {float(want):.4f}, got {float(torch.as_tensor(got)):.4f}")


def softmax_with_sink(scores: Tensor, sink_logit: Tensor) -> Tensor:
    """Attention weights when an empty slot with logit ``sink_logit`` joins the softmax.

    scores: [H, T, S]; sink_logit: [H]. Returns the weights on the S real keys, [H, T, S]; they
    sum to 1 minus the share the empty slot takes:  w_j = exp(s_j) / (exp(b) + sum_i exp(s_i)).
    """
    extra = sink_logit[:, None, None].expand(*scores.shape[:2], 1)
    return torch.softmax(torch.cat([scores, extra], dim=-1), dim=-1)[..., :-1]


@exercise("06.softmax_with_sink", "Exercise 4 (a softmax that may attend to nothing)", softmax_with_sink)
def _check_softmax(fn) -> None:
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(2, 3, 5, generator=g) * 3
    for logit in (torch.tensor([0.0, 2.0]), torch.tensor([-1.0, 5.0])):
        got, want = fn(scores, logit), softmax_with_sink(scores, logit)
        if close(got, want, 1e-5):
            continue
        if close(got, torch.softmax(scores, -1), 1e-5):
            raise Wrong("the empty slot takes part in the normalisation: add exp(sink_logit) to the denominator")
        if torch.as_tensor(got).shape[-1] == scores.shape[-1] + 1:
            raise Wrong("return the weights of the real keys only (drop the empty slot's column)")
        raise Wrong("expected exp(s_j) / (exp(b_h) + sum_i exp(s_i)) for every head h")


# ----------------------------------------------------------------------------- 4. the training step's clipping
def clip_gradients(grads: list[Tensor], max_norm: float) -> list[Tensor]:
    """Global-norm gradient clipping, as the training step does before the optimizer step.

    grads: the gradients of every parameter (any shapes). The norm is taken over all of them
    together, sqrt(sum_i ||g_i||^2); if it exceeds ``max_norm`` every gradient is scaled by
    max_norm / (norm + 1e-6), otherwise they are returned unchanged (as torch.nn.utils.clip_grad_norm_).
    """
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    scale = min(1.0, max_norm / (float(norm) + 1e-6))
    return [g * scale for g in grads]


def _torch_clipped(grads: list[Tensor], max_norm: float) -> list[Tensor]:
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    return [p.grad for p in params]


@exercise("06.clip_gradients", "Exercise 3 (clip the gradients of a training step)", clip_gradients)
def _check_clip(fn) -> None:
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(4, 3, generator=g, dtype=torch.float64) * 2, torch.randn(5, generator=g, dtype=torch.float64),
             torch.randn(2, 2, 2, generator=g, dtype=torch.float64) * 0.1]
    total = float(torch.sqrt(sum((x ** 2).sum() for x in grads)))
    for max_norm in (total / 4, total * 3):
        got = fn([x.clone() for x in grads], max_norm)
        want = _torch_clipped(grads, max_norm)
        matches = isinstance(got, (list, tuple)) and len(got) == len(want)
        if matches and all(close(a, b, 1e-6) for a, b in zip(got, want)):
            continue
        if not isinstance(got, (list, tuple)) or len(got) != len(grads):
            raise Wrong(f"return a list with one clipped gradient per parameter ({len(grads)} here)")
        per_tensor = [x * min(1.0, max_norm / (float(x.norm()) + 1e-6)) for x in grads]
        if all(close(a, b, 1e-6) for a, b in zip(got, per_tensor)):
            raise Wrong("clip with ONE norm over all the gradients together, sqrt(sum of squared norms), "
                        "not each gradient by its own norm: clipping must not change the update's direction")
        if max_norm > total and not all(close(a, b, 1e-6) for a, b in zip(got, grads)):
            raise Wrong("when the total norm is below max_norm, leave the gradients unchanged (never scale them up)")
        summed = sum(float(x.norm()) for x in grads)
        if all(close(a, x * min(1.0, max_norm / (summed + 1e-6)), 1e-6) for a, x in zip(got, grads)):
            raise Wrong("the global norm is the square root of the sum of the squared norms, not the sum of the norms")
        raise Wrong(f"max_norm={max_norm:.3f}: the clipped gradients differ from torch.nn.utils.clip_grad_norm_'s")
