"""Notebook 06 (training a sink token): references and checkers."""

from __future__ import annotations

from types import SimpleNamespace

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


@exercise("06.softmax_with_sink", "Exercise 3 (a softmax that may attend to nothing)", softmax_with_sink)
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


# ----------------------------------------------------------------------------- 4. attention with a sink logit
def attention_with_sink(q: Tensor, k: Tensor, v: Tensor, sink_logit: Tensor) -> Tensor:
    """Causal attention of one sequence in which every head may also attend to an empty slot.

    q, k, v: [H, T, d]; sink_logit: [H]. Scores s_tj = q_t . k_j / sqrt(d) for keys j <= t (the
    future is masked before the softmax); the empty slot (logit b_h, no value) joins every row's
    softmax. Returns the output [H, T, d]: sum_j w_tj v_j, with weights that sum to less than 1.
    """
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5  # [H, T, T]
    t = scores.shape[-1]
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return softmax_with_sink(scores.masked_fill(future, float("-inf")), sink_logit) @ v


def _course_attention(q: Tensor, k: Tensor, v: Tensor, sink_logit: Tensor) -> Tensor:
    """The models' own attention (course.models.attend, the explicit path) on one sequence: [H, T, d]."""
    from course.models.attend import attend

    return attend(q[None], k[None], v[None], causal=True, sink_logit=sink_logit, explicit=True)[0][0]


@exercise("06.attention_with_sink", "Exercise 4 (attention with a sink logit, end to end)", attention_with_sink)
def _check_attention(fn) -> None:
    g = torch.Generator().manual_seed(4)
    h, t, d = 3, 6, 8
    q, k, v = (torch.randn(h, t, d, generator=g) * 2 for _ in range(3))
    for logit in (torch.tensor([0.0, 1.5, -2.0]), torch.tensor([3.0, -1.0, 0.5])):
        got = fn(q.clone(), k.clone(), v.clone(), logit.clone())
        want = _course_attention(q, k, v, logit)
        if close(got, want, 1e-4):
            continue
        got = torch.as_tensor(got)
        if got.shape != want.shape:
            raise Wrong(f"return the output of every head and query, shape [H, T, d] = {list(want.shape)}; "
                        f"got {list(got.shape)}")
        scores = q @ k.transpose(-1, -2) / d ** 0.5
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        masked = scores.masked_fill(future, float("-inf"))
        if close(got, torch.softmax(masked, -1) @ v, 1e-4):
            raise Wrong("the empty slot is missing from the softmax: its exp(b_h) belongs in every row's "
                        "denominator (a plain softmax makes each row's weights sum to exactly 1)")
        if close(got, softmax_with_sink(scores, logit) @ v, 1e-4):
            raise Wrong("a query may not see the future: set the scores of keys after it to -inf before the softmax")
        if close(got, (softmax_with_sink(scores, logit) * ~future) @ v, 1e-4):
            raise Wrong("mask the future before the softmax (scores -inf), not after it: zeroing weights afterwards "
                        "leaves the future keys in every row's denominator")
        if close(got, softmax_with_sink(masked * d ** 0.5, logit) @ v, 1e-4):
            raise Wrong("scale the scores by 1/sqrt(d) before the softmax (d = the head dimension)")
        if close(got, torch.softmax(torch.cat([masked, logit[:, None, None].expand(h, t, 1)], -1), -1)
                 @ torch.cat([v, v[:, :1]], 1), 1e-4):
            raise Wrong("the empty slot has no value: the weight it takes is lost, not spent on the first token")
        raise Wrong(f"sink logit {logit.tolist()}: the output differs from the course's attention "
                    "(course.models.attend with causal=True and this sink logit)")


# ----------------------------------------------------------------------------- 5. build: the whole layer
def layer_parts(attn) -> SimpleNamespace:
    """What a student's layer may use of a GPT-2-family attention module ``attn`` (course.models.gpt2):
    ``qkv`` (nn.Linear D -> 3D, W_Q, W_K, W_V side by side), ``out`` (nn.Linear D -> D), ``sink_logit`` [H] and
    ``n_head``; not the module's own forward."""
    return SimpleNamespace(qkv=attn.qkv, out=attn.out, sink_logit=attn.sink_logit, n_head=attn.cfg.n_head)


def sink_attention_layer(x: Tensor, layer: SimpleNamespace) -> Tensor:
    """A whole multi-head causal self-attention layer with a learned sink logit per head, from scratch.

    x: [B, T, D]; layer: ``layer_parts`` of a GPT-2-family attention module. Project x to q, k, v
    (``layer.qkv``, then split into three [B, T, D]), split each into H heads of d = D / H ([B, H, T, d]),
    score s_tj = q_t . k_j / sqrt(d), set the future (j > t) to -inf, append every head's sink logit as one
    more column, softmax over the T + 1 columns, drop the sink's column, weight the values, merge the heads
    back to [B, T, D] and apply ``layer.out``. Returns [B, T, D].
    """
    return _sink_layer(x, layer)


def _sink_layer(x, layer, sink: str = "per_head", mask: str = "before", scale: bool = True, heads: str = "split"):
    """``sink_attention_layer`` and its typical mistakes: ``sink="shared"`` uses head 0's logit in every head,
    ``sink="none"`` leaves the empty slot out; ``mask="after"`` zeroes the future's weights after the softmax;
    ``scale=False`` skips 1/sqrt(d); ``heads="reshape"`` reshapes [B, T, D] straight to [B, H, T, d]."""
    b, t, dm = x.shape
    h = layer.n_head
    d = dm // h
    q, k, v = layer.qkv(x).split(dm, dim=-1)
    if heads == "split":
        q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in (q, k, v))  # [B, H, T, d]
    else:
        q, k, v = (z.reshape(b, h, t, d) for z in (q, k, v))
    scores = q @ k.transpose(-1, -2) / (d**0.5 if scale else 1.0)  # [B, H, T, T]
    future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
    if mask == "before":
        scores = scores.masked_fill(future, float("-inf"))
    logit = layer.sink_logit if sink == "per_head" else layer.sink_logit[:1].expand(h)
    if sink == "none":
        w = torch.softmax(scores, dim=-1)
    else:
        w = torch.softmax(torch.cat([scores, logit.view(1, h, 1, 1).expand(b, h, t, 1)], dim=-1), dim=-1)[..., :-1]
    if mask == "after":
        w = w.masked_fill(future, 0.0)
    return layer.out((w @ v).transpose(1, 2).reshape(b, t, dm))


_SINK_LAYER_MISTAKES = [
    (dict(sink="shared"), "every head has its own sink logit (layer.sink_logit is [H]): head h's empty slot takes "
                          "logit b_h, not one logit for all heads"),
    (dict(sink="none"), "the empty slot is missing from the softmax: append each head's sink logit as an extra "
                        "column, softmax over T + 1 columns, then drop that column"),
    (dict(mask="after"), "mask the future before the softmax (scores -inf), not after it: zeroing weights afterwards "
                         "leaves the future keys in every row's denominator"),
    (dict(scale=False), "scale the scores by 1/sqrt(d) before the softmax (d = D / H, the head dimension)"),
    (dict(heads="reshape"), "split the heads as view(B, T, H, d).transpose(1, 2): a reshape of [B, T, D] straight "
                            "to [B, H, T, d] mixes tokens and heads"),
]


def _course_layer(model) -> tuple[list[Tensor], list[Tensor]]:
    """Every layer's input x [B, T, D] and the course's attention output [B, T, D] (the oracle), from one
    forward of ``model``."""
    seen_x, seen_y = [], []

    def record(module, args, out) -> None:
        seen_x.append(args[0])
        seen_y.append(out[0])

    hooks = [block.attn.register_forward_hook(record) for block in model.blocks]
    try:
        with torch.inference_mode():
            model(torch.randint(0, 53, (2, 11), generator=torch.Generator().manual_seed(6)))
    finally:
        for hook in hooks:
            hook.remove()
    return seen_x, seen_y


@exercise("06.sink_attention_layer", "Build exercise (a multi-head attention layer with a sink logit per head)",
          sink_attention_layer, points=3)
def _check_sink_layer(fn) -> None:
    from course.exercises.fixtures import tiny_model

    model = tiny_model("gpt2", seed=6, sink_logit="learned")
    with torch.no_grad():
        for i, block in enumerate(model.blocks):  # distinct logits per head, some above the real scores
            block.attn.sink_logit.copy_(torch.tensor([-1.0, 0.5, 2.0, 4.0]).roll(i))
    xs, ys = _course_layer(model)
    for i, (x, want) in enumerate(zip(xs, ys)):
        layer = layer_parts(model.blocks[i].attn)
        with torch.inference_mode():
            got = fn(x.clone(), layer)
        if close(got, want, 1e-9):
            continue
        if torch.as_tensor(got).shape != want.shape:
            raise Wrong(f"return the layer's output [B, T, D] = {list(want.shape)} (heads merged, then layer.out); "
                        f"got {list(torch.as_tensor(got).shape)}")
        with torch.inference_mode():
            for settings, hint in _SINK_LAYER_MISTAKES:
                if close(got, _sink_layer(x, layer, **settings), 1e-9):
                    raise Wrong(hint)
        raise Wrong(f"layer {i}: your output differs from the course's GPT-2 attention with a sink logit "
                    "(course.models.gpt2.Attention)")
