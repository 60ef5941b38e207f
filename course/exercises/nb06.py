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


# ----------------------------------------------------------------------------- 6. build: the gated layer
def _gated_layer_with_course(x: Tensor, layer) -> Tensor:
    """AUTOFILL's build: the course's causal ``attend``, the heads merged, the course's ``output_gate``,
    ``layer.out``."""
    b, t, dm = x.shape
    h = layer.n_head
    q, k, v = (z.view(b, t, h, dm // h).transpose(1, 2) for z in layer.qkv(x).split(dm, dim=-1))
    y = attend(q, k, v, causal=True)[0].transpose(1, 2).reshape(b, t, dm)
    return layer.out(output_gate(y, x, layer.gate))


def _gated_variant(x: Tensor, layer, gate_from: str = "x", gate_at: str = "before_out", squash: bool = True,
                   merge: str = "transpose", mask: str = "before") -> Tensor:
    """The gated layer [B, T, D] with the switches of its typical mistakes (the diagnosis's candidates): the gate
    computed from the merged heads (``gate_from="y"``), applied after ``layer.out``, without the sigmoid, left
    out (``gate_at="none"``), the heads merged by a plain reshape, the future zeroed after the softmax."""
    b, t, dm = x.shape
    h = layer.n_head
    d = dm // h
    q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in layer.qkv(x).split(dm, dim=-1))
    scores = q @ k.transpose(-1, -2) / d**0.5
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    w = torch.softmax(scores.masked_fill(future, float("-inf")) if mask == "before" else scores, dim=-1)
    w = w.masked_fill(future, 0.0) if mask == "after" else w
    y = (w @ v).transpose(1, 2).reshape(b, t, dm) if merge == "transpose" else (w @ v).reshape(b, t, dm)
    logits = layer.gate(x if gate_from == "x" else y)
    gate = torch.sigmoid(logits) if squash else logits
    if gate_at == "after_out":
        return layer.out(y) * gate
    return layer.out(y) if gate_at == "none" else layer.out(y * gate)


_GATE_MISTAKES = [
    (dict(gate_at="none"), hint(1, "the gate is missing: multiply the merged heads by sigmoid(layer.gate(x)), then "
                                   "apply layer.out")),
    (dict(gate_from="y"), hint(3, "the gate is computed from the layer's input x (the query token's hidden state), "
                                  "not from the attention's output")),
    (dict(gate_at="after_out"), hint(3, "the gate sits between the attention and the output projection (the paper's "
                                        "position G1): gate the merged heads, then apply layer.out")),
    (dict(squash=False), hint(1, "squash the gate's logits with a sigmoid, so that every gate lies in (0, 1)")),
    (dict(merge="reshape"), hint(2, "merge the heads as transpose(1, 2).reshape(B, T, D): [B, H, T, d] -> "
                                    "[B, T, H, d] -> [B, T, D]")),
    (dict(mask="after"), hint(3, "mask the future before the softmax (scores -inf), not after it")),
]


@exercise("06.gated_attention_layer", "Build exercise (a gated attention layer: attention, gate, projection)",
          points=4, kind="build", fallback=_gated_layer_with_course, shortcuts=(*_ATTENTION, output_gate, OutputGate))
def _check_gated_layer(fn) -> None:
    model = tiny_model("gpt2", seed=7, output_gate="elementwise")
    xs, ys = _course_layer(model)
    for i, (x, want) in enumerate(zip(xs, ys)):
        parts = layer_parts(model.blocks[i].attn)
        with torch.inference_mode():
            got = fn(x.clone(), parts)
        if close(got, want, 1e-9):
            continue
        got = _of_shape(got, want, "the layer's output [B, T, D] (attention, heads merged, gated, then layer.out)")
        with torch.inference_mode():
            for switches, message in _GATE_MISTAKES:
                if close(got, _gated_variant(x, parts, **switches), 1e-9):
                    raise Wrong(message)
        raise Wrong(hint(2, f"layer {i}: the output differs from the gated layer's: causal attention with 1/sqrt(d), "
                            "heads merged, times sigmoid(layer.gate(x)), then layer.out"))
