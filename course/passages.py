"""Many passages, one protocol: a result measured on one text is an anecdote.

    passages = sample_passages(tokenizer, 8, 512)              # the novels' openings, then mid-text passages
    ppl = stream_passages(model, passages, {"window": make_policy("window", 64, model=model), ...}, start=64)
    print(spread(ppl["window"]))                                # median, mean, range (an interval from 8 on)

Passages are drawn reproducibly (a seed) from all six Austen novels: first the openings of some novels
(half the passages by default), then passages that begin at a paragraph start at random places inside
the novels, taken in turn. Every
passage has the same number of tokens, so a policy streams all of them in one batch.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from dataclasses import dataclass

import torch
from torch import Tensor

from course.assets import AUSTEN_BOOKS
from course.data import load_text
from course.models.base import CausalLM
from course.policies import Policy
from course.stats import MIN_FOR_INTERVAL, bootstrap_interval
from course.streaming import evaluate_stream

__all__ = ["MIN_FOR_INTERVAL", "Passage", "Spread", "passage_batch", "sample_passages", "spread", "stream_passages"]

CHARS_PER_TOKEN = 8  # generous: English prose takes about 4 characters per token in these tokenizers


@dataclass(frozen=True)
class Passage:
    """``tokens`` ids [1, T] from ``book``, starting at character ``offset`` (0: the novel's opening)."""

    book: str
    offset: int
    ids: Tensor

    @property
    def label(self) -> str:
        return f"{self.book.replace('_', ' ')}, {'opening' if self.offset == 0 else f'from character {self.offset:,}'}"


@dataclass(frozen=True)
class Spread:
    """How a metric varies over passages: its values and their summary. ``ci``: a bootstrap 95 % interval of
    the median when there are at least ``MIN_FOR_INTERVAL`` values, else None (the values themselves are shown)."""

    values: tuple[float, ...]
    mean: float
    median: float
    low: float
    high: float
    ci: tuple[float, float] | None

    def __str__(self) -> str:
        n = len(self.values)
        if self.ci is not None:
            return (f"median {self.median:.3g} (95% CI {self.ci[0]:.3g}-{self.ci[1]:.3g}), mean {self.mean:.3g}, "
                    f"range {self.low:.3g}-{self.high:.3g} over {n} passages")
        return (f"median {self.median:.3g}, mean {self.mean:.3g}, values {', '.join(f'{v:.3g}' for v in self.values)} "
                f"over {n} passages (too few for an interval: n < {MIN_FOR_INTERVAL})")

    def share(self, holds) -> float:
        """Share of the passages whose value satisfies ``holds(value)``."""
        return sum(bool(holds(v)) for v in self.values) / len(self.values)


def spread(values, seed: int = 0, resamples: int = 2000) -> Spread:
    """Summary of a metric over passages (at least two values; an interval from ``MIN_FOR_INTERVAL`` on)."""
    values = tuple(float(v) for v in values)
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"spread needs at least two finite values, got {values}")
    ci = bootstrap_interval(values, "median", seed, resamples) if len(values) >= MIN_FOR_INTERVAL else None
    return Spread(values, statistics.fmean(values), statistics.median(values), min(values), max(values), ci)


def sample_passages(tokenizer, n: int, tokens: int, seed: int = 0, openings: int | None = None) -> list[Passage]:
    """``n`` passages of ``tokens`` tokens: ``openings`` novels' openings first (default: half the passages,
    at most the six), then passages from random paragraph starts, one novel after another. The same seed
    gives the same passages."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2 (one passage is an anecdote), got {n!r}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 2:
        raise ValueError(f"tokens must be an integer >= 2, got {tokens!r}")
    rng = random.Random(seed)
    books = list(AUSTEN_BOOKS.values())
    texts = {b: load_text("austen", b) for b in books}
    n_open = min(len(books), n // 2 if openings is None else openings, n)
    starts: list[tuple[str, int]] = [(b, 0) for b in books][:n_open]
    paragraphs = {b: [m.end() for m in re.finditer(r"\n\n(?=[^\n])", t)] for b, t in texts.items()}
    turn = 0
    while len(starts) < n:
        book = books[turn % len(books)]
        usable = [p for p in paragraphs[book] if p < len(texts[book]) - CHARS_PER_TOKEN * tokens]
        offset = rng.choice(usable)
        if (book, offset) not in starts:
            starts.append((book, offset))
        turn += 1
    out = []
    for book, offset in starts:
        piece = texts[book][offset : offset + CHARS_PER_TOKEN * tokens]
        ids = tokenizer(piece, return_tensors="pt", add_special_tokens=False).input_ids
        if ids.shape[1] < tokens:
            raise ValueError(f"a passage of {book} at {offset} has only {ids.shape[1]} tokens, fewer than {tokens}")
        out.append(Passage(book, offset, ids[:, :tokens]))
    return out


def passage_batch(passages: list[Passage]) -> Tensor:
    """The passages' ids as one batch [N, T] (they must all have the same number of tokens)."""
    if not passages:
        raise ValueError("passages is empty")
    lengths = {p.ids.shape[1] for p in passages}
    if len(lengths) != 1:
        raise ValueError(f"passages must all have the same number of tokens, got {sorted(lengths)}")
    return torch.cat([p.ids for p in passages])


def stream_passages(model: CausalLM, passages: list[Passage], policies: dict[str, Policy], start: int = 0,
                    progress: bool = True) -> dict[str, list[float]]:
    """Perplexity of every passage under every policy, over the predictions from ``start`` on (e.g. the
    budget: after the cache fills). All passages stream as one batch per policy (``evaluate_stream``: the
    exact evaluator for position-only policies). Returns {policy name: [ppl per passage]}."""
    batch = passage_batch(passages).to(model.device)
    n_tokens = batch.shape[1]
    if not 0 <= start < n_tokens - 1:
        raise ValueError(f"start must be between 0 and {n_tokens - 2}, got {start}")
    out = {}
    for name, policy in policies.items():
        out[name] = evaluate_stream(model, batch, policy, progress=progress).ppl_per_stream(start)
    return out
