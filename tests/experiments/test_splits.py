"""Exploration and confirmation apart (course.splits): the two splits never share a character of a novel or a
seed, the split in force comes from COURSE_SPLIT with a clear error, and every draw is written down."""

from __future__ import annotations

import pytest

from course import splits
from course.assets import AUSTEN_BOOKS
from course.data import load_split_text, load_text
from course.splits import SEED_BLOCK, current_split, split_range, split_seed


def test_the_split_in_force_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("COURSE_SPLIT", raising=False)
    assert current_split() == "confirmation"
    monkeypatch.setenv("COURSE_SPLIT", "exploration")
    assert current_split() == "exploration" and split_seed(3) == 3 + SEED_BLOCK
    monkeypatch.setenv("COURSE_SPLIT", "explore")
    with pytest.raises(ValueError, match="COURSE_SPLIT must be one of exploration, confirmation"):
        current_split()
    with pytest.raises(ValueError, match="split must be one of"):
        split_range(100, "test")


def test_seeds_of_the_two_splits_never_meet():
    conf = {split_seed(s, "confirmation") for s in (0, 1, 99_999, SEED_BLOCK - 1)}
    expl = {split_seed(s, "exploration") for s in (0, 1, 99_999, SEED_BLOCK - 1)}
    assert max(conf) < SEED_BLOCK <= min(expl) and max(expl) < 2**32
    for bad in (-1, SEED_BLOCK, 1.0, True):
        with pytest.raises(ValueError, match="seed must be an integer from 0 to 2147483647"):
            split_seed(bad, "confirmation")


def test_the_splits_characters_of_every_novel_are_disjoint_and_cover_it():
    for book in AUSTEN_BOOKS.values():
        n = len(load_text("austen", book))
        (a, b), (c, d) = split_range(n, "confirmation"), split_range(n, "exploration")
        assert a == 0 and b == c and d == n and 0.75 * n < b < 0.85 * n  # the opening is confirmation's
        text, start = load_split_text(book, "exploration", record=False)
        assert start == c and text == load_text("austen", book)[c:]


def test_passages_of_the_two_splits_never_overlap(smollm2):
    from course.passages import sample_passages

    tok = smollm2[1]
    del splits.DRAWN[:]
    conf = sample_passages(tok, 12, 256, seed=0, split="confirmation")
    expl = sample_passages(tok, 12, 256, seed=0, split="exploration")
    ranges = {s: [(d["source"], d["start"], d["end"]) for d in splits.drawn() if d["what"] == "text"
                  and d["split"] == s] for s in splits.SPLITS}
    assert len(ranges["confirmation"]) == len(ranges["exploration"]) == 12
    for src, a, b in ranges["confirmation"]:
        for src2, c, d in ranges["exploration"]:
            assert src != src2 or b <= c or d <= a, (src, a, b, c, d)
        assert b <= split_range(len(load_text("austen", src.split("/")[1])), "confirmation")[1]
    assert all(p.split == "confirmation" for p in conf) and all(p.split == "exploration" for p in expl)
    assert [p.opening for p in conf[:6]] == [True] * 6 and [p.offset for p in conf[:6]] == [0] * 6
    assert [p.opening for p in expl[:6]] == [True] * 6 and all(p.offset > 0 for p in expl)


def test_needles_draw_from_their_split(smollm2):
    from course.evaluate import make_needle_trials

    tok = smollm2[1]
    del splits.DRAWN[:]
    a = make_needle_trials(tok, 3, 200, seed=0, split="confirmation")
    b = make_needle_trials(tok, 3, 200, seed=0, split="exploration")
    assert {t.key for t in a}.isdisjoint({t.key for t in b})
    assert [d["split"] for d in splits.drawn()] == ["confirmation"] * 2 + ["exploration"] * 2
