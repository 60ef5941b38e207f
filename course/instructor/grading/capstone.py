"""The capstone of notebook 07 graded on what it achieves: continuation perplexity on held-out passages.

The grader, and only the grader, runs the student's score function as a policy (``score_policy``) on
passages the notebooks never show, at a stated budget, with the protocol of notebook 07 (compress the
context, then decode the continuation one token at a time, ``compare_after_compression``), beside the two
baselines at the same budget:

* perplexity below StreamingLLM's (4 sinks + recent): full marks;
* below the plain window's (recent tokens only): ``PARTIAL`` points;
* otherwise none. The feedback gives the three perplexities.

The passages are Austen, but not where the notebooks look: ``sample_passages`` starts at a novel's opening or
at a paragraph; these start mid-paragraph at a sentence, at offsets listed here (``HELD_OUT``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch

from course.exercises.core import Partial, Wrong

__all__ = ["HELD_OUT", "SETTINGS", "Settings", "measure", "judge"]

# (book, character offset): the passage starts at the first sentence that begins after the offset
HELD_OUT: tuple[tuple[str, int], ...] = (
    ("emma", 412_345), ("persuasion", 203_117), ("mansfield_park", 611_903), ("northanger_abbey", 154_321),
)


@dataclass(frozen=True)
class Settings:
    """The stated measurement: model, budget (slots per KV head), context and scored continuation (tokens)."""

    model: str = "smollm2-135m"
    budget: int = 24
    context: int = 96
    continuation: int = 32
    sinks: int = 4
    partial: int = 1  # points for beating the plain window only


SETTINGS = Settings()


@lru_cache(maxsize=2)
def _model_and_passages(name: str, tokens: int):
    from course.data import load_text
    from course.models import load_model

    model, tokenizer = load_model(name, "cpu", verbose=False)
    rows = []
    for book, offset in HELD_OUT:
        text = load_text("austen", book)
        start = re.compile(r"[.!?]\s+(?=[A-Z])").search(text, offset).end()
        ids = tokenizer(text[start : start + 12 * tokens], return_tensors="pt", add_special_tokens=False).input_ids
        if ids.shape[1] < tokens:
            raise ValueError(f"the held-out passage of {book} at {offset} is shorter than {tokens} tokens")
        rows.append(ids[:, :tokens])
    return model, torch.cat(rows)


def _perplexities(contenders: dict, settings: Settings) -> dict[str, float]:
    from course.evaluate import compare_after_compression

    s = settings
    model, ids = _model_and_passages(s.model, s.context + s.continuation)
    with torch.inference_mode():
        out = compare_after_compression(model, ids[:, : s.context], ids[:, s.context :], contenders)
    return {name: math.exp(-float(res[0].double().mean())) for name, res in out.items()}


@lru_cache(maxsize=4)
def _baselines(settings: Settings) -> dict[str, float]:
    from course.policies import make_policy

    model, _ = _model_and_passages(settings.model, settings.context + settings.continuation)
    return _perplexities({"streaming": make_policy("streaming", settings.budget, sinks=settings.sinks, model=model),
                          "window": make_policy("window", settings.budget, model=model)}, settings)


def measure(score_fn: Callable, settings: Settings = SETTINGS) -> dict[str, float]:
    """Continuation perplexity of ``score_fn`` (as ``score_policy``), StreamingLLM and the plain window, all at
    ``settings.budget`` slots, over the held-out passages (one batch): {"yours", "streaming", "window"}.
    The baselines are measured once per process."""
    from course.function_policy import score_policy

    yours = _perplexities({"yours": score_policy(score_fn, settings.budget, name="yours")}, settings)
    return {**yours, **_baselines(settings)}


def judge(score_fn: Callable, settings: Settings = SETTINGS) -> str:
    """Full marks (returns the note for the feedback), ``Partial`` or ``Wrong``, from ``measure``."""
    try:
        _model_and_passages(settings.model, settings.context + settings.continuation)
    except Exception as e:  # the grader's machine, not the student's policy
        raise Wrong(f"not measured: the grader could not load {settings.model} or its held-out passages "
                    f"({type(e).__name__}: {e}); the instructor must run `python -m course fetch` and grade again") \
            from None
    ppl = measure(score_fn, settings)
    if not math.isfinite(ppl["yours"]):
        raise Wrong("on the held-out passages your policy gave a non-finite perplexity")
    where = (f"on {len(HELD_OUT)} held-out passages at {settings.budget} slots per KV head ({settings.model}, "
             f"{settings.context} context + {settings.continuation} scored tokens): yours {ppl['yours']:.2f}, "
             f"StreamingLLM {ppl['streaming']:.2f}, window {ppl['window']:.2f}")
    if ppl["yours"] < ppl["streaming"]:
        return f"beats StreamingLLM {where}"
    if ppl["yours"] < ppl["window"]:
        raise Partial(f"beats the plain window but not StreamingLLM {where}", settings.partial)
    raise Wrong(f"does not beat the plain window {where}")
