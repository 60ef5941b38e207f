"""Notebook 06 (training a sink token): checkers, each against the course's own mechanisms."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from course.builds import layer_parts
from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close, generator, tiny_model
from course.exercises.hints import hint
from course.models.attend import attend, attention_weights
from course.models.base import OutputGate, output_gate
from course.train import lm_loss, prepend_sink

_ATTENTION = (attend, attention_weights)


@exercise("06.prepend_sink", "Exercise 1 (prepend the sink token)", fallback=prepend_sink, shortcuts=(prepend_sink,))
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


@exercise("06.lm_loss", "Exercise 2 (never predict the sink)", fallback=lm_loss, shortcuts=(lm_loss,))
def _check_loss(fn) -> None:
    g = generator(0)
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
        late = F.cross_entropy(logits[:, 1:-1].reshape(-1, 11), inputs[:, 2:].reshape(-1))
        if n_prefix == 1 and close(got, late, 1e-5):
            raise Wrong("the first content token is a target too: it is predicted from the sink's position")
        if n_prefix == 0 and close(got, late, 1e-5):
            raise Wrong("with n_prefix = 0 there is no sink: every token but the first is a target")
        if n_prefix == 1 and not close(got, with_sink, 1e-5):
            raise Wrong("the sink token (input position 0) must never be a target; every content token must be")
        raise Wrong(f"n_prefix={n_prefix}: expected {float(want):.4f}, got {float(torch.as_tensor(got)):.4f}")


def _sink_softmax(scores: Tensor, sink_logit: Tensor) -> Tensor:
    """AUTOFILL's softmax with an empty slot: the course's ``attention_weights`` with the sink logit, for queries
    whose scores against one-hot keys are the given scores [H, T, S] (a masked score, -inf, becomes the dtype's
    lowest finite number, so that the product with the one-hot keys stays finite: its weight is still 0)."""
    s = scores.shape[-1]
    finite = scores.clamp_min(torch.finfo(scores.dtype).min)
    return attention_weights(finite[None], torch.eye(s, dtype=scores.dtype)[None, None], scale=1.0,
                             sink_logit=sink_logit)[0]



@exercise("06.softmax_with_sink", "Exercise 3 (a softmax that may attend to nothing)", fallback=_sink_softmax,
          shortcuts=_ATTENTION)
def _check_softmax(fn) -> None:
    g = generator(1)
    scores = torch.randn(2, 3, 5, generator=g) * 3
    for logit in (torch.tensor([0.0, 2.0]), torch.tensor([-1.0, 5.0])):
        got, want = fn(scores, logit), _sink_softmax(scores, logit)
        if close(got, want, 1e-5):
            continue
        if close(got, torch.softmax(scores, -1), 1e-5):
            raise Wrong("the empty slot takes part in the normalisation: add exp(sink_logit) to the denominator")
        if torch.as_tensor(got).shape[-1] == scores.shape[-1] + 1:
            raise Wrong("return the weights of the real keys only (drop the empty slot's column)")
        raise Wrong("expected exp(s_j) / (exp(b_h) + sum_i exp(s_i)) for every head h")


def _of_shape(got, want: Tensor, what: str) -> Tensor:
    """``got`` as a tensor, or a ``Wrong`` saying what to return (``what``) and the shape when it has another."""
    got = torch.as_tensor(got)
    if got.shape != want.shape:
        raise Wrong(f"return {what} = {list(want.shape)}; got {list(got.shape)}")
    return got


# ----------------------------------------------------------------------------- 4. attention with a sink logit
def _course_attention(q: Tensor, k: Tensor, v: Tensor, sink_logit: Tensor) -> Tensor:
    """The models' own attention (course.models.attend, the explicit path) on one sequence: [H, T, d]."""
    return attend(q[None], k[None], v[None], causal=True, sink_logit=sink_logit, explicit=True)[0][0]


@exercise("06.attention_with_sink", "Exercise 4 (attention with a sink logit, end to end)",
          fallback=_course_attention, shortcuts=_ATTENTION)
def _check_attention(fn) -> None:
    g = generator(4)
    h, t, d = 3, 6, 8
    q, k, v = (torch.randn(h, t, d, generator=g) * 2 for _ in range(3))
    for logit in (torch.tensor([0.0, 1.5, -2.0]), torch.tensor([3.0, -1.0, 0.5])):
        got = fn(q.clone(), k.clone(), v.clone(), logit.clone())
        want = _course_attention(q, k, v, logit)
        if close(got, want, 1e-4):
            continue
        got = _of_shape(got, want, "the output of every head and query, shape [H, T, d]")
        scores = q @ k.transpose(-1, -2) / d ** 0.5
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        masked = scores.masked_fill(future, float("-inf"))
        if close(got, torch.softmax(masked, -1) @ v, 1e-4):
            raise Wrong("the empty slot is missing from the softmax: its exp(b_h) belongs in every row's "
                        "denominator (a plain softmax makes each row's weights sum to exactly 1)")
        if close(got, _sink_softmax(scores, logit) @ v, 1e-4):
            raise Wrong("a query may not see the future: set the scores of keys after it to -inf before the softmax")
        if close(got, (_sink_softmax(scores, logit) * ~future) @ v, 1e-4):
            raise Wrong("mask the future before the softmax (scores -inf), not after it: zeroing weights afterwards "
                        "leaves the future keys in every row's denominator")
        if close(got, _sink_softmax(masked * d ** 0.5, logit) @ v, 1e-4):
            raise Wrong("scale the scores by 1/sqrt(d) before the softmax (d = the head dimension)")
        if close(got, torch.softmax(torch.cat([masked, logit[:, None, None].expand(h, t, 1)], -1), -1)
                 @ torch.cat([v, v[:, :1]], 1), 1e-4):
            raise Wrong("the empty slot has no value: the weight it takes is lost, not spent on the first token")
        raise Wrong(f"sink logit {logit.tolist()}: the output differs from the course's attention "
                    "(course.models.attend with causal=True and this sink logit)")


# ----------------------------------------------------------------------------- 5. build: the whole layer
def _layer_with_course(x: Tensor, layer) -> Tensor:
    """AUTOFILL's build: the layer's projections around the course's ``attend`` (causal, with the sink logit)."""
    b, t, dm = x.shape
    h = layer.n_head
    q, k, v = (z.view(b, t, h, dm // h).transpose(1, 2) for z in layer.qkv(x).split(dm, dim=-1))
    out, _ = attend(q, k, v, causal=True, sink_logit=layer.sink_logit)
    return layer.out(out.transpose(1, 2).reshape(b, t, dm))


def _sink_model(logits: list[float] | None) -> torch.nn.Module:
    """A tiny GPT-2 with a sink logit per head: distinct logits per head and layer, some above the real scores
    (``logits`` None), or the same ``logits`` in every layer."""
    model = tiny_model("gpt2", seed=6, sink_logit="learned")
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            values = torch.tensor([-1.0, 0.5, 2.0, 4.0]).roll(i) if logits is None else torch.tensor(logits)
            block.attn.sink_logit.copy_(values)
    return model


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
            model(torch.randint(0, 53, (2, 11), generator=generator(6)))
    finally:
        for h in hooks:
            h.remove()
    return seen_x, seen_y


def _right_on(fn, model) -> bool:
    """Does ``fn`` give the course's output in every layer of ``model``?"""
    xs, ys = _course_layer(model)
    try:
        with torch.inference_mode():
            return all(close(fn(x.clone(), layer_parts(block.attn)), y, 1e-9)
                       for x, y, block in zip(xs, ys, model.blocks))
    except Exception:  # a probe only narrows the hint down
        return False


def _diagnose_layer(fn) -> str:
    """The mistake, narrowed down by probes where parts of the computation cannot matter."""
    if not _right_on(fn, _sink_model([-1e9] * 4)):
        return hint(3, "even with every sink logit at -inf (no empty slot) your output differs: mask the future before "
                       "the softmax (scores -inf, not weights 0 afterwards), scale by 1/sqrt(d) with d = D / H, and "
                       "split the heads as view(B, T, H, d).transpose(1, 2)")
    if _right_on(fn, _sink_model([1.5] * 4)):
        return hint(3, "every head has its own sink logit (layer.sink_logit is [H]): head h's empty slot takes logit "
                       "b_h, not one logit for all heads")
    return hint(1, "right without the empty slot, wrong with it: append each head's sink logit as an extra column, "
                   "softmax over T + 1 columns, then drop that column (the empty slot has no value)")


@exercise("06.sink_attention_layer", "Build exercise (a multi-head attention layer with a sink logit per head)",
          points=6, kind="build", fallback=_layer_with_course, shortcuts=_ATTENTION)
def _check_sink_layer(fn) -> None:
    model = _sink_model(None)
    xs, ys = _course_layer(model)
    for i, (x, want) in enumerate(zip(xs, ys)):
        with torch.inference_mode():
            got = fn(x.clone(), layer_parts(model.blocks[i].attn))
        if close(got, want, 1e-9):
            continue
        if torch.as_tensor(got).shape != want.shape:
            raise Wrong(hint(2, f"return the layer's output [B, T, D] = {list(want.shape)} (heads merged, then "
                                f"layer.out); got {list(torch.as_tensor(got).shape)}"))
        raise Wrong(_diagnose_layer(fn))


# ----------------------------------------------------------------------------- 6. the output gate
def _gated_with_course(y: Tensor, x: Tensor, layer) -> Tensor:
    """AUTOFILL's gate: the heads merged, the course's ``output_gate``, then ``layer.out``."""
    b, h, t, d = y.shape
    return layer.out(output_gate(y.transpose(1, 2).reshape(b, t, h * d), x, layer.gate))


@torch.inference_mode()
def _gated_inputs(model) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Per layer of a gated GPT-2: (the heads' outputs y [B, H, T, d], the layer's input x [B, T, D], the layer's
    output [B, T, D]), from one forward (the course's attention gives y, the model's own forward the output)."""
    xs, outs = _course_layer(model)
    rows = []
    for x, out, block in zip(xs, outs, model.blocks):
        b, t, dm = x.shape
        h = model.config.n_head
        q, k, v = (z.view(b, t, h, dm // h).transpose(1, 2) for z in block.attn.qkv(x).split(dm, dim=-1))
        rows.append((attend(q, k, v, causal=True)[0], x, out))
    return rows


@exercise("06.gated_output", "Exercise 5 (the output gate of gated attention)", fallback=_gated_with_course,
          shortcuts=(output_gate, OutputGate))
def _check_gate(fn) -> None:
    model = tiny_model("gpt2", seed=7, output_gate="elementwise")
    for i, (y, x, want) in enumerate(_gated_inputs(model)):
        parts = layer_parts(model.blocks[i].attn)
        with torch.inference_mode():
            got = fn(y.clone(), x.clone(), parts)
        if close(got, want, 1e-9):
            continue
        got = _of_shape(got, want, "the layer's output [B, T, D] (heads merged, gated, then layer.out)")
        b, h, t, d = y.shape
        merged = y.transpose(1, 2).reshape(b, t, h * d)
        with torch.inference_mode():
            wrong = {
                "the gate is computed from the layer's input x (the query token's hidden state), not from the "
                "attention output y": parts.out(merged * torch.sigmoid(parts.gate(merged))),
                "the gate sits before the output projection: gate the merged heads, then apply layer.out":
                    parts.out(merged) * torch.sigmoid(parts.gate(x)),
                "squash the gate's logits with a sigmoid, so that each gate lies in (0, 1)":
                    parts.out(merged * parts.gate(x)),
                "the gate is missing: multiply the merged heads by sigmoid(layer.gate(x)) before layer.out":
                    parts.out(merged),
                "merge the heads as transpose(1, 2).reshape(B, T, H * d): [B, H, T, d] -> [B, T, H, d] -> [B, T, D]":
                    parts.out(y.reshape(b, t, h * d) * torch.sigmoid(parts.gate(x))),
            }
        for message, output in wrong.items():
            if close(got, output, 1e-9):
                raise Wrong(message)
        raise Wrong(f"layer {i}: the output differs from the gated layer's "
                    "(layer.out(merged ⊙ sigmoid(layer.gate(x))))")
