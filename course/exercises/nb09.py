"""Notebook 09 (retrieval and streaming heads): checkers, each against the course's own mechanisms.

The build, the retrieval score of every head, is checked on two models: a tiny random Llama (the real code path:
its score must equal the course's ``course.heads.retrieval_scores`` to the last digit) and a *planted* model whose
attention maps are written by hand, one head per behaviour the score must tell apart (a head that copies the
answer from the needle, one that copies half of it, one a query too late, one from outside the needle, one that
looks at the needle but at the wrong token, one that rests on the sink). Only the planted heads make a wrong rule
visible: a random model's arg-max almost never lands on the needle.
"""

from __future__ import annotations

import torch
from torch import Tensor

from course.evaluate import NeedleTrial
from course.exercises.core import Wrong, exercise
from course.exercises.fixtures import close, generator, tiny_model
from course.exercises.hints import hint
from course.headwise import adakv_counts, ada_kv
from course.heads import copy_hits, kv_head_scores, retrieval_scores
from course.models.base import ModelConfig, ModelOutput

# ----------------------------------------------------------------------------- 1. Ada-KV's budgets


def _counts_with_course(scores: Tensor, budget: int, safeguard: float) -> Tensor:
    """AUTOFILL's allocation: the course's ``adakv_counts`` for one batch row ([H_kv, S] -> [H_kv] long)."""
    return adakv_counts(scores[None], budget, safeguard)[0]


def _diagnose_counts(got: Tensor, want: Tensor, scores: Tensor, budget: int, safeguard: float) -> str:
    h, s = scores.shape
    return (f"scores [{h}, {s}], budget={budget}, safeguard={safeguard}: expected counts {want.tolist()}, got "
            f"{got.tolist()}; " + _counts_mistake(got, scores, budget, safeguard))


def _counts_mistake(got: Tensor, scores: Tensor, budget: int, safeguard: float) -> str:
    h, s = scores.shape
    if int(got.sum()) != h * budget:
        return f"the layer keeps exactly H_kv x budget = {h * budget} slots in all, got {int(got.sum())}"
    if bool((got == budget).all()):
        return "one top-k over all the layer's heads together (flatten the scores), not budget slots per head"
    plain = torch.bincount(scores.flatten().topk(h * budget).indices // s, minlength=h)
    if torch.equal(got, plain):
        return (f"first give every head its safeguard, int(budget x safeguard) = {max(1, int(budget * safeguard))} "
                "best slots of its own, then share the rest over all heads")
    return "each head keeps its safeguard of best slots, then the layer's remaining slots go to the best scores " \
           "left over all heads; count per head"


@exercise("09.adakv_counts", "Exercise 1 (Ada-KV shares a layer's budget)", points=2, fallback=_counts_with_course,
          shortcuts=(adakv_counts, ada_kv))
def _check_counts(fn) -> None:
    g = generator(9)
    for h, s, budget, safeguard in ((3, 40, 8, 0.2), (4, 30, 6, 0.5), (2, 50, 10, 0.2)):
        scores = torch.rand(h, s, generator=g) ** 3
        scores[0] *= 4  # one head that attends sharply: Ada-KV gives it more
        want = _counts_with_course(scores, budget, safeguard)
        got = fn(scores.clone(), budget, safeguard)  # a copy: changing it in place is allowed
        try:
            got = torch.as_tensor(got).long().flatten()
        except (TypeError, RuntimeError, ValueError):
            raise Wrong("return one count per KV head: a [H_kv] tensor of integers") from None
        if got.shape != want.shape:
            raise Wrong(f"return one count per KV head: shape {tuple(want.shape)}, got {tuple(got.shape)}")
        if not torch.equal(got, want):
            raise Wrong(_diagnose_counts(got, want, scores, budget, safeguard))


# ----------------------------------------------------------------------------- 2. a KV head's score
@exercise("09.kv_head_scores", "Exercise 2 (one score per KV head)", fallback=kv_head_scores,
          shortcuts=(kv_head_scores,))
def _check_kv_scores(fn) -> None:
    g = generator(11)
    for layers, heads, kv in ((4, 6, 2), (3, 8, 4), (2, 4, 4)):
        scores = torch.rand(layers, heads, generator=g) ** 4
        want = kv_head_scores(scores, kv)
        got = fn(scores.clone(), kv)  # a copy: changing it in place is allowed
        try:
            got = torch.as_tensor(got).double()
        except (TypeError, RuntimeError, ValueError):
            raise Wrong("return a [layers, kv_heads] tensor") from None
        if close(got, want.double()):
            continue
        if got.shape != want.shape:
            raise Wrong(f"return one score per layer and KV head: shape {tuple(want.shape)}, got {tuple(got.shape)}")
        group = heads // kv
        if close(got, scores.reshape(layers, kv, group).mean(-1).double()):
            raise Wrong("take the largest score of the group, not the mean: one retrieving query head is enough "
                        "for its KV head to need every slot")
        if close(got, scores.reshape(layers, group, kv).amax(1).double()):
            raise Wrong("query heads h*G .. h*G+G-1 share KV head h (G = heads / kv_heads): group neighbouring "
                        "heads, not every kv_heads-th")
        raise Wrong(f"scores [{layers}, {heads}], kv_heads={kv}: per KV head, the largest retrieval score among the "
                    f"query heads h*G .. h*G+G-1 that share it (G = {group}); row 0 expected "
                    f"{[round(float(x), 4) for x in want[0]]}, got {[round(float(x), 4) for x in got[0]]}")


# ----------------------------------------------------------------------------- 3. build: retrieval scores
# The planted heads of the second model, one per behaviour, and the score the course gives each.
PLANTED = ("copies", "copies half", "a query late", "outside the needle", "wrong needle token", "sink")
PLANTED_SCORE = (1.0, 0.5, 0.0, 0.0, 0.0, 0.0)


def _planted_trial(seed: int) -> NeedleTrial:
    """A passkey prompt in token ids: filler (ids 20..52), a needle holding the key's tokens (ids 10..19) twice,
    a copy of the key's first token in the filler after the needle, and the question (ids 1..5); the answer is the
    key's tokens."""
    g = generator(seed)
    key = torch.randperm(10, generator=g)[:4] + 10
    before = torch.randint(20, 53, (12,), generator=g)
    needle = torch.cat([torch.tensor([6, 7]), key, torch.tensor([8]), key, torch.tensor([9])])
    after = torch.cat([torch.randint(20, 53, (6,), generator=g), key[:1], torch.randint(20, 53, (6,), generator=g)])
    prompt = torch.cat([before, needle, after, torch.arange(1, 6)])
    lo = before.shape[0]
    return NeedleTrial(prompt[None], key.clone(), (lo, lo + needle.shape[0]), 0.5, "planted")


class PlantedModel:
    """A stand-in for a model whose attention maps are planted: ``model(ids, output_attentions=True)`` returns,
    for every layer, [1, H, T, T] weights where head ``PLANTED[h]`` has its arg-max where its behaviour puts it
    (every other key gets a small, equal share). Layer l repeats the heads rotated by l, so a mix-up of layers and
    heads shows. Its trials must be those of ``_planted_trial`` (it finds the needle by the marker token 6)."""

    def __init__(self, n_layer: int = 2) -> None:
        h = len(PLANTED)
        self.config = ModelConfig(family="llama", vocab_size=53, n_layer=n_layer, n_head=h, n_kv_head=h,
                                  d_model=8 * h, head_dim=8, d_ff=48, max_positions=512, name="planted")
        self.device = torch.device("cpu")
        self.dtype = torch.float64

    def __call__(self, ids: Tensor, *args, output_attentions: bool = False, **kwargs) -> ModelOutput:
        ids = torch.as_tensor(ids)
        if ids.dim() == 1:
            ids = ids[None]
        t = ids.shape[1]
        maps = [self._layer(ids[0], (layer % len(PLANTED))) for layer in range(self.config.n_layer)]
        logits = torch.zeros(ids.shape[0], t, self.config.vocab_size, dtype=self.dtype)
        return ModelOutput(logits, maps if output_attentions else None)

    def _layer(self, ids: Tensor, shift: int) -> Tensor:
        t, h = ids.shape[0], len(PLANTED)
        top = torch.zeros(h, t, dtype=torch.long)  # [H, T] each query's arg-max key; 0 (the sink) by default
        lo = int((ids == 6).nonzero()[0])
        hi = int((ids == 9).nonzero()[0]) + 1
        start = int((ids == 5).nonzero()[-1]) + 1  # the answer follows the question's last token
        for i in range(start, t):
            at = lo + 2 + int((ids[lo + 2: lo + 6] == ids[i]).nonzero()[0])  # ids[i] inside the needle
            behaviour = {0: (i - 1, at), 1: (i - 1, at if (i - start) % 2 == 0 else 0), 2: (i, at),
                         3: (i - 1, hi + 6 if ids[hi + 6] == ids[i] else 0),
                         4: (i - 1, lo + (at - lo + 1 - 2) % 4 + 2), 5: (i - 1, 0)}
            for head, (row, key) in behaviour.items():
                top[(head + shift) % h, row] = key
        weights = torch.full((h, t, t), 0.1, dtype=self.dtype).tril()
        weights.scatter_(2, top[..., None], 5.0)
        weights = weights.tril()
        return (weights / weights.sum(-1, keepdim=True))[None]


@torch.inference_mode()
def _scores_with_course(model, trials: list[NeedleTrial]) -> Tensor:
    """AUTOFILL's retrieval scores, and the oracle on the planted model: the course's copy rule
    (``course.heads.copy_hits``) over each trial's attention maps (the prompt and the answer in one forward, the rows
    of the queries that produce the answer), averaged over the trials: [L, H]."""
    rates = []
    for trial in trials:
        ids, p = torch.cat([trial.prompt[0], trial.answer]), trial.prompt.shape[1]
        maps = model(ids[None].to(model.device), output_attentions=True).attentions
        slots = torch.arange(ids.shape[0]).expand(maps[0].shape[1], -1)  # [H, S]: slot s holds position s
        rates.append(torch.stack([copy_hits(m[0, :, p - 1:-1].double().cpu(), slots, trial.prompt[0].cpu(),
                                            trial.answer.cpu(), trial.needle).double().mean(-1) for m in maps]))
    return torch.stack(rates).mean(0)


def _planted_scores(n_layer: int) -> Tensor:
    """The score each planted head must get: [L, H]."""
    want = torch.tensor(PLANTED_SCORE, dtype=torch.float64)
    return torch.stack([want.roll(layer % len(PLANTED)) for layer in range(n_layer)])


def _planted_feedback(got: Tensor, want: Tensor) -> str:
    """The planted model's layer 0, head by head: the score expected and the score received."""
    heads = [f"{name} {w:.2f} (got {g:.2f})" for name, w, g in zip(PLANTED, want[0].tolist(), got[0].tolist())]
    return f"the planted model, 2 prompts, layer 0, expected per head: {'; '.join(heads)}"


def _diagnose_scores(got: Tensor, want: Tensor, n_trials: int) -> str:
    seen = _planted_feedback(got, want)

    def say(number: int, text: str) -> str:  # every message ends with the planted heads' scores
        return hint(number, f"{text}; {seen}")

    heads = dict(zip(PLANTED, got[0].tolist()))
    if abs(heads["copies"] - n_trials) < 1e-6:
        return say(2, "average over the trials: a head that copies every answer token in every trial scores 1")
    if abs(heads["copies"] - 1.0) > 1e-6 and heads["copies"] > 0:
        return say(2, "divide a head's hits by the number of answer tokens (a head that copies each of them "
                       "scores 1)")
    if heads["a query late"] > 0 and heads["copies"] < 1:
        return say(3, "answer token i is produced by the query at position i - 1: read row i - 1 of the maps")
    if heads["outside the needle"] > 0:
        return say(1, "only a key inside the needle counts (trial.needle): the same token elsewhere is not "
                       "retrieval")
    if heads["wrong needle token"] > 0:
        return say(1, "the key the head attends most must hold the very token being produced: "
                       "ids[key] == ids[i]")
    if heads["sink"] > 0:
        return say(1, "a head resting on the sink copies nothing")
    return say(1, "a head hits when its most-attended key (arg-max of the row) is a needle position holding the "
                   "answer token being produced; score = hits / answer tokens, averaged over trials")


@exercise("09.retrieval_scores", "Build exercise (the retrieval score of every head)", points=6, kind="build",
          fallback=_scores_with_course, shortcuts=(retrieval_scores, copy_hits))
def _check_retrieval_scores(fn) -> None:
    trials = [_planted_trial(s) for s in (1, 2)]
    model = PlantedModel(n_layer=3)
    want = _scores_with_course(model, trials)
    if not close(want, _planted_scores(3), 1e-9):  # the oracle itself, on heads whose score is known
        raise RuntimeError("the course's retrieval score disagrees with the planted heads")
    try:
        got = torch.as_tensor(fn(model, trials)).double()
    except (TypeError, RuntimeError, ValueError) as e:
        if "output_attentions" in str(e) or "NoneType" in str(e):
            raise Wrong(hint(2, "ask the model for its attention maps: model(ids, output_attentions=True)"
                                ".attentions, one [1, H, T, T] tensor per layer")) from None
        raise
    if got.shape != want.shape:
        raise Wrong(hint(2, f"return one score per layer and query head: shape {tuple(want.shape)}, got "
                            f"{tuple(got.shape)}"))
    if not close(got, want, 1e-9):
        raise Wrong(_diagnose_scores(got, want, len(trials)))
    real = tiny_model("llama", seed=9, n_layer=2)
    g = generator(10)
    trials = [NeedleTrial(torch.randint(0, 53, (1, 40), generator=g), torch.randint(0, 53, (3,), generator=g),
                          (10, 20), 0.5, "random") for _ in range(2)]
    got, want = torch.as_tensor(fn(real, trials)).double(), retrieval_scores(real, trials).double()
    if not close(got, want, 1e-9):
        shape = f"shape {tuple(want.shape)}, got {tuple(got.shape)}" if got.shape != want.shape else \
            f"largest difference {float((got - want).abs().max()):.3g}"
        raise Wrong(hint(1, "right on hand-made maps but not on a real model's (a tiny random Llama, 2 prompts of "
                            f"40 tokens with 3 answer tokens; expected {shape}): feed the prompt followed by the "
                            "answer, one forward, and read every layer's maps"))
