"""Many passages, one protocol: a result measured on one text is an anecdote.

    passages = sample_passages(tokenizer, 8, 512)              # the novels' openings, then mid-text passages
    ppl = stream_passages(model, passages, {"window": make_policy("window", 64, model=model), ...}, start=64)
    print(spread(ppl["window"]))                                # median, mean, range (a 95% interval from 6 on)

Passages are drawn reproducibly (a seed) from all six Austen novels: first the openings of some novels
(half the passages by default), then passages that begin at a paragraph start at random places inside
the novels, taken in turn. Every passage has the same number of tokens, so a policy streams all of them in
one batch.

Exploration and confirmation apart (``course.splits``): a passage lies wholly inside its split's characters of
the novel. The confirmation split (the default, ``COURSE_SPLIT``) holds the openings and the first four fifths
of every novel; the exploration split, on which thresholds are chosen, the last fifth, where its "openings" are
the first paragraph starts. A fresh draw (``"fresh:N"``, ``python -m course reproduce --fresh N``) reads the
confirmation characters but takes no openings and no passage that overlaps one the confirmation split would give the
same call: its data is new to whoever chose the notebooks' rules. Every passage drawn is written down
(``course.splits.DRAWN``).
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
from course.data import load_split_text
from course.models.base import CausalLM
from course.policies import Policy
from course.stats import LEVEL, MIN_FOR_INTERVAL, median_interval
from course.splits import SPLITS, check_split, fresh_draw, record_text, split_seed
from course.streaming import evaluate_stream

__all__ = ["MIN_FOR_INTERVAL", "SPLITS", "Passage", "Spread", "passage_batch", "sample_passages", "first_passage",
           "split_seed",
           "spread", "stream_passages"]

CHARS_PER_TOKEN = 8  # generous: English prose takes about 4 characters per token in these tokenizers


@dataclass(frozen=True)
class Passage:
    """``ids`` [1, T] from ``book``, starting at character ``offset``, drawn from ``split``; ``opening``: the first
    passage of the split's share of the novel (in confirmation, the novel's opening)."""

    book: str
    offset: int
    ids: Tensor
    split: str = "confirmation"
    opening: bool = False

    @property
    def label(self) -> str:
        where = "opening" if self.offset == 0 else f"from character {self.offset:,}"
        return f"{self.book.replace('_', ' ')}, {where}" + ("" if self.split == "confirmation" else f" ({self.split})")


@dataclass(frozen=True)
class Spread:
    """How a metric varies over passages: its values and their summary. ``ci``: the order-statistic interval of
    the median at ``coverage`` >= 95 % (``course.stats.median_interval``) from ``MIN_FOR_INTERVAL`` values on,
    else None: the values themselves are shown, with the coverage of their range [low, high], 1 - 2^(1-n)."""

    values: tuple[float, ...]
    mean: float
    median: float
    low: float
    high: float
    ci: tuple[float, float] | None
    coverage: float

    def __str__(self) -> str:
        n = len(self.values)
        if self.ci is not None:
            return (f"median {self.median:.3g} ({self.coverage:.0%} interval {self.ci[0]:.3g}-{self.ci[1]:.3g}), "
                    f"mean {self.mean:.3g}, range {self.low:.3g}-{self.high:.3g} over {n} passages")
        return (f"median {self.median:.3g}, mean {self.mean:.3g}, values {', '.join(f'{v:.3g}' for v in self.values)} "
                f"over {n} passages (too few for a 95% interval of the median: n < {MIN_FOR_INTERVAL}; their range "
                f"covers it with probability 1 - 2^(1-n) = {self.coverage:.0%})")

    def share(self, holds) -> float:
        """Share of the passages whose value satisfies ``holds(value)``."""
        return sum(bool(holds(v)) for v in self.values) / len(self.values)


def spread(values) -> Spread:
    """Summary of a metric over passages (at least two values; a 95 % interval of the median from
    ``MIN_FOR_INTERVAL`` on)."""
    values = tuple(float(v) for v in values)
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"spread needs at least two finite values, got {values}")
    low, high, _, coverage = median_interval(values)
    ci = (low, high) if coverage >= LEVEL else None
    return Spread(values, statistics.fmean(values), statistics.median(values), min(values), max(values), ci, coverage)


def _from_first_paragraph(text: str, start: int) -> tuple[str, int]:
    """``text`` (which begins at character ``start`` of its novel) from its first paragraph start on."""
    at = re.search(r"\n\n(?=[^\n])", text).end()
    return text[at:], start + at


def _starts(texts: dict[str, str], n: int, n_open: int, tokens: int, rng: random.Random,
            avoid: tuple[tuple[str, int], ...] = ()) -> list[tuple[str, int]]:
    """Where the passages begin (book, character in the split's text): the first ``n_open`` books' first
    characters, then random paragraph starts, one book after another, none overlapping a passage of ``avoid``."""
    books = list(texts)
    span = CHARS_PER_TOKEN * tokens
    starts: list[tuple[str, int]] = [(b, 0) for b in books][:n_open]
    paragraphs = {b: [m.end() for m in re.finditer(r"\n\n(?=[^\n])", t)] for b, t in texts.items()}
    turn = 0
    while len(starts) < n:
        book = books[turn % len(books)]
        taken = [at for b, at in avoid if b == book]
        usable = [p for p in paragraphs[book] if 0 < p < len(texts[book]) - span
                  and all(abs(p - at) >= span for at in taken)]
        if not usable:
            raise ValueError(f"{book}: no paragraph start leaves room for a passage of {tokens} tokens")
        offset = rng.choice(usable)
        if (book, offset) not in starts:
            starts.append((book, offset))
        turn += 1
    return starts


def sample_passages(tokenizer, n: int, tokens: int, seed: int = 0, openings: int | None = None,
                    split: str | None = None) -> list[Passage]:
    """``n`` passages of ``tokens`` tokens from ``split`` ("exploration", "confirmation" or a fresh draw "fresh:N";
    None: ``COURSE_SPLIT``, confirmation by default): ``openings`` novels' openings first (default: half the
    passages, at most the six), then passages from random paragraph starts, one novel after another. The same seed
    and split give the same passages; exploration and confirmation never share a character (``course.splits``). A
    fresh draw takes no openings and no passage overlapping one that confirmation gives the same call."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2 (one passage is an anecdote), got {n!r}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 2:
        raise ValueError(f"tokens must be an integer >= 2, got {tokens!r}")
    split = check_split(split)
    rng = random.Random(split_seed(seed, split))
    shares = {b: load_split_text(b, split, record=False) for b in AUSTEN_BOOKS.values()}
    if split == "exploration":  # its "openings": the first paragraph start of the share
        shares = {b: _from_first_paragraph(t, start) for b, (t, start) in shares.items()}
    texts = {b: t for b, (t, _) in shares.items()}
    n_open = min(len(texts), n // 2 if openings is None else openings, n)
    avoid: tuple[tuple[str, int], ...] = ()
    if fresh_draw(split) is not None:  # the passages confirmation gives this call, and its openings, are avoided
        mine = random.Random(split_seed(seed, "confirmation", record=False))
        avoid = tuple(_starts(texts, n, n_open, tokens, mine)) + tuple((b, 0) for b in texts)
        n_open = 0
    return [_passage(tokenizer, shares, book, at, tokens, split)
            for book, at in _starts(texts, n, n_open, tokens, rng, avoid)]


def first_passage(tokenizer, book: str, tokens: int, seed: int = 0, split: str | None = None) -> Passage:
    """The one passage a notebook tells a story on: ``tokens`` tokens from the start of ``split``'s share of Austen's
    ``book`` (confirmation: the novel's opening; exploration: the first paragraph of its last fifth). A fresh draw
    takes a passage of ``book`` at a paragraph start drawn from its seed, away from the opening."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 2:
        raise ValueError(f"tokens must be an integer >= 2, got {tokens!r}")
    if book not in AUSTEN_BOOKS.values():
        raise ValueError(f"book must be one of {', '.join(AUSTEN_BOOKS.values())}, got {book!r}")
    split = check_split(split)
    shares = {book: load_split_text(book, split, record=False)}
    if split == "exploration":
        shares = {book: _from_first_paragraph(*shares[book])}
    if fresh_draw(split) is None:
        return _passage(tokenizer, shares, book, 0, tokens, split)
    rng = random.Random(split_seed(seed, split))
    (_, at), = _starts({book: shares[book][0]}, 1, 0, tokens, rng, avoid=((book, 0),))
    return _passage(tokenizer, shares, book, at, tokens, split)


def _passage(tokenizer, shares: dict[str, tuple[str, int]], book: str, at: int, tokens: int, split: str) -> Passage:
    """The passage of ``tokens`` tokens at character ``at`` of ``book``'s share (``shares[book]``: its text and
    where it begins in the novel), written down as drawn."""
    text, start = shares[book]
    piece = text[at : at + CHARS_PER_TOKEN * tokens]
    ids = tokenizer(piece, return_tensors="pt", add_special_tokens=False).input_ids
    offset = start + at
    if ids.shape[1] < tokens:
        raise ValueError(f"a passage of {book} at {offset} has only {ids.shape[1]} tokens, fewer than {tokens}")
    record_text(f"austen/{book}", offset, offset + len(piece), split)
    return Passage(book, offset, ids[:, :tokens], split, at == 0)


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
