"""The capstone of notebook 07 graded on what it achieves: continuation NLL on held-out passages.

The grader, and only the grader, runs the student's score function as a policy (``score_policy``: original
positions) on passages drawn when the course was released and kept in the grading key, at a stated budget, with
the protocol of notebook 07 (compress the context, then decode the continuation one token at a time,
``compare_after_compression``), beside StreamingLLM and the plain window at the same budget and under the same
position rule (original positions). The verdict compares the student's NLL with StreamingLLM's passage by
passage, with a bootstrap interval of the mean difference over passages, so that full marks need a margin the
passages' own spread cannot explain:

* better than StreamingLLM (the interval's upper end below 0): full marks;
* indistinguishable from StreamingLLM (the interval contains 0): ``Settings.partial`` points;
* worse (the interval's lower end above 0), or a non-finite NLL: none.

The feedback gives the three perplexities, the mean difference and its interval, and n.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from course.exercises.core import Partial, Wrong

__all__ = ["SETTINGS", "Settings", "passage_ids", "per_passage_nll", "paired_interval", "measure", "judge",
           "capstone_measure"]


@dataclass(frozen=True)
class Settings:
    """The stated measurement: model, budget (slots per KV head), context and scored continuation (tokens), the
    baseline's sinks, the points for a policy indistinguishable from StreamingLLM, the bootstrap."""

    model: str = "smollm2-135m"
    budget: int = 32
    context: int = 128
    continuation: int = 32
    sinks: int = 4
    partial: int = 4
    resamples: int = 4000
    level: float = 0.95


SETTINGS = Settings()


def passage_ids(tokenizer, passages: Sequence[tuple[str, int]], tokens: int) -> Tensor:
    """[N, tokens] ids: each passage starts at the first sentence that begins after its character offset."""
    from course.data import load_text

    rows = []
    for book, offset in passages:
        text = load_text("austen", book)
        found = re.compile(r"[.!?]\s+(?=[A-Z])").search(text, offset)
        if found is None:
            raise ValueError(f"the held-out passage of {book} at {offset} starts past the book's last sentence")
        ids = tokenizer(text[found.end() : found.end() + 12 * tokens], return_tensors="pt",
                        add_special_tokens=False).input_ids
        if ids.shape[1] < tokens:
            raise ValueError(f"the held-out passage of {book} at {offset} is shorter than {tokens} tokens")
        rows.append(ids[:, :tokens])
    return torch.cat(rows)


@lru_cache(maxsize=2)
def _model_and_ids(name: str, passages: tuple[tuple[str, int], ...], tokens: int):
    from course.models import load_model

    model, tokenizer = load_model(name, "cpu", verbose=False)
    return model, passage_ids(tokenizer, passages, tokens)


def per_passage_nll(model, ids: Tensor, context: int, contenders: dict) -> dict[str, Tensor]:
    """Mean NLL of the continuation ids[:, context:] of every passage [N], per contender (policies), after each
    compressed the context's cache (one shared prompt forward)."""
    from course.evaluate import compare_after_compression

    with torch.inference_mode():
        out = compare_after_compression(model, ids[:, :context], ids[:, context:], contenders)
    return {name: -res[0].double().mean(dim=1) for name, res in out.items()}


def paired_interval(diff: Tensor, resamples: int, level: float, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean of per-passage differences and its percentile bootstrap interval."""
    g = torch.Generator().manual_seed(seed)
    n = diff.shape[0]
    means = diff[torch.randint(0, n, (resamples, n), generator=g)].mean(dim=1).sort().values
    tail = (1 - level) / 2
    return float(diff.mean()), float(means[int(tail * resamples)]), float(means[int((1 - tail) * resamples) - 1])


@lru_cache(maxsize=4)
def _baselines(settings: Settings, passages: tuple[tuple[str, int], ...]) -> dict[str, Tensor]:
    from course.policies import make_policy

    model, ids = _model_and_ids(settings.model, passages, settings.context + settings.continuation)
    s = settings
    return per_passage_nll(model, ids, s.context, {
        "streaming": make_policy("streaming", s.budget, sinks=s.sinks, positions="original", model=model),
        "window": make_policy("window", s.budget, model=model)})


def measure(score_fn: Callable, passages: Sequence[tuple[str, int]], settings: Settings = SETTINGS
            ) -> dict[str, Tensor]:
    """Per-passage continuation NLL [N] of ``score_fn`` (as ``score_policy``), StreamingLLM and the plain window,
    all at ``settings.budget`` slots with original positions: {"yours", "streaming", "window"}. The baselines are
    measured once per process."""
    from course.function_policy import score_policy

    passages = tuple((str(b), int(o)) for b, o in passages)
    model, ids = _model_and_ids(settings.model, passages, settings.context + settings.continuation)
    yours = per_passage_nll(model, ids, settings.context, {"yours": score_policy(score_fn, settings.budget)})
    return {**yours, **_baselines(settings, passages)}


def judge(score_fn: Callable, passages: Sequence[tuple[str, int]], settings: Settings = SETTINGS) -> str:
    """Full marks (returns the note for the feedback), ``Partial`` or ``Wrong``, from ``measure``."""
    if len(passages) < 8:
        raise ValueError(f"passages must hold at least 8 held-out passages for an interval, got {len(passages)}")
    try:
        _model_and_ids(settings.model, tuple((str(b), int(o)) for b, o in passages),
                       settings.context + settings.continuation)
    except Exception as e:  # the grader's machine, not the student's policy
        raise Wrong(f"not measured: the grader could not load {settings.model} or its held-out passages "
                    f"({type(e).__name__}: {e}); the instructor must run `python -m course fetch` and grade again") \
            from None
    nll = measure(score_fn, passages, settings)
    if not bool(torch.isfinite(nll["yours"]).all()):
        raise Wrong("on the held-out passages your policy gave a non-finite loss")
    mean, low, high = paired_interval(nll["yours"] - nll["streaming"], settings.resamples, settings.level)
    ppl = {name: math.exp(float(v.mean())) for name, v in nll.items()}
    where = (f"on {len(passages)} held-out passages at {settings.budget} slots per KV head ({settings.model}, "
             f"{settings.context} context + {settings.continuation} scored tokens, original positions): perplexity "
             f"yours {ppl['yours']:.2f}, StreamingLLM {ppl['streaming']:.2f}, window {ppl['window']:.2f}; your NLL "
             f"minus StreamingLLM's {mean:+.4f} nats per token, {settings.level:.0%} interval over passages "
             f"[{low:+.4f}, {high:+.4f}], n = {len(passages)}")
    if high < 0:
        return f"better than StreamingLLM beyond the passages' spread {where}"
    if low <= 0:
        raise Partial(f"indistinguishable from StreamingLLM (the interval contains 0) {where}", settings.partial)
    raise Wrong(f"worse than StreamingLLM beyond the passages' spread {where}")


def capstone_measure(passages: Sequence[tuple[str, int]], settings: Settings = SETTINGS) -> Callable[[Callable], str]:
    """The grader's measurement of ``07.my_policy`` on the key's passages."""

    def measure_fn(fn: Callable) -> str:
        return judge(fn, passages, settings)

    return measure_fn
