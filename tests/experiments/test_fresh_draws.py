"""Fresh draws (course.splits "fresh:N", python -m course reproduce --fresh N): every draw has seeds of its own,
apart from both splits and from every other draw; its passages lie in the confirmation characters and never
overlap the passages (or the openings) the notebooks read; bad seeds and splits get a clear error."""

from __future__ import annotations

import pytest

from course import splits
from course.data import load_text
from course.splits import (FRESH_BASE, GENERATOR_SEED_MAX, SEED_BLOCK, current_split, fresh_draw, fresh_split,
                           split_range, split_seed)


def test_a_fresh_draw_is_named_and_checked(monkeypatch):
    assert fresh_split(7) == "fresh:7" and fresh_draw("fresh:7") == 7
    assert fresh_draw("confirmation") is None and fresh_draw("exploration") is None
    for bad in (-1, SEED_BLOCK, 1.5, True, "3"):
        with pytest.raises(ValueError, match="the fresh draw's seed must be an integer from 0 to 2147483647"):
            fresh_split(bad)
    for bad in ("fresh", "fresh:", "fresh:-1", "fresh:x", f"fresh:{SEED_BLOCK}", "stale:1"):
        with pytest.raises(ValueError, match="split must be one of exploration, confirmation or 'fresh:N'"):
            split_seed(0, bad)
    monkeypatch.setenv("COURSE_SPLIT", "fresh:12")
    assert current_split() == "fresh:12" and split_seed(3) == FRESH_BASE + 12 * SEED_BLOCK + 3
    monkeypatch.setenv("COURSE_SPLIT", "fresh:twelve")
    with pytest.raises(ValueError, match="COURSE_SPLIT must be one of .*'fresh:N'.*got 'fresh:twelve'"):
        current_split()


def test_every_draw_has_seeds_of_its_own():
    base = (0, 1, 99_999, SEED_BLOCK - 1)
    streams = {name: {split_seed(s, name, record=False) for s in base}
               for name in ("confirmation", "exploration", "fresh:0", "fresh:1", f"fresh:{SEED_BLOCK - 1}")}
    seen: set[int] = set()
    for name, seeds in streams.items():
        assert len(seeds) == len(base) and seeds.isdisjoint(seen), name
        seen |= seeds
    assert min(streams["fresh:0"]) >= 2 * SEED_BLOCK > max(streams["exploration"])
    assert max(seen) == GENERATOR_SEED_MAX < 2**63  # torch and random accept it
    import torch

    torch.Generator().manual_seed(GENERATOR_SEED_MAX)


def test_a_fresh_draw_reads_the_confirmation_characters():
    n = len(load_text("austen", "emma"))
    assert split_range(n, "fresh:3") == split_range(n, "confirmation")


def test_a_seed_computed_but_not_drawn_is_not_written_down():
    del splits.DRAWN[:]
    split_seed(5, "confirmation", record=False)
    assert splits.DRAWN == []
    split_seed(5, "fresh:2")
    assert splits.DRAWN == [{"split": "fresh:2", "what": "seed", "seed": 5, "drawn": FRESH_BASE + 2 * SEED_BLOCK + 5}]


def test_fresh_passages_avoid_the_notebooks_passages_and_differ_by_draw(smollm2):
    from course.passages import CHARS_PER_TOKEN, sample_passages

    tok = smollm2[1]
    tokens = 256
    mine = sample_passages(tok, 8, tokens, seed=0, split="confirmation")
    del splits.DRAWN[:]
    a = sample_passages(tok, 8, tokens, seed=0, split="fresh:1")
    b = sample_passages(tok, 8, tokens, seed=0, split="fresh:2")
    again = sample_passages(tok, 8, tokens, seed=0, split="fresh:1")
    assert [(p.book, p.offset) for p in again] == [(p.book, p.offset) for p in a]  # the same draw, the same passages
    span = CHARS_PER_TOKEN * tokens
    for p in a + b:
        assert p.offset > 0 and not p.opening and p.split.startswith("fresh:")
        for q in mine:
            assert p.book != q.book or abs(p.offset - q.offset) >= span, (p.label, q.label)
        end = split_range(len(load_text("austen", p.book)), "confirmation")[1]
        assert p.offset + span <= end
    assert [(p.book, p.offset) for p in a] != [(p.book, p.offset) for p in b]
    assert {d["split"] for d in splits.drawn()} == {"fresh:1", "fresh:2"}
    assert "(fresh:1)" in a[0].label


def test_the_fresh_check_refuses_data_of_other_splits():
    from course.instructor.fresh_draws import fresh_problems

    seed = FRESH_BASE + 4 * SEED_BLOCK
    good = {"split": "fresh:4", "drawn": [{"split": "fresh:4", "what": "seed", "seed": 0, "drawn": seed},
                                          {"split": "fresh:4", "what": "text", "source": "austen/emma",
                                           "start": 1000, "end": 5000}]}
    assert fresh_problems(good, 4) == []
    assert fresh_problems(good, 5)[0].startswith("ran on the fresh:4 split, not fresh:5")
    n = len(load_text("austen", "emma"))
    late = {"split": "fresh:4", "drawn": [{"split": "fresh:4", "what": "text", "source": "austen/emma",
                                           "start": n - 100, "end": n}]}
    assert "outside the confirmation share" in fresh_problems(late, 4)[0]
    other = {"split": "fresh:4", "drawn": [{"split": "fresh:4", "what": "seed", "seed": 0, "drawn": 0}]}
    assert "outside fresh draw 4's stream" in fresh_problems(other, 4)[0]
    assert fresh_problems({"split": "fresh:4", "drawn": []}, 4) == ["no record of the data it drew"]


def test_the_command_refuses_bad_seeds_and_missing_notebooks(tmp_path, capsys):
    from course.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main(["reproduce", "--fresh", "-1"])
    assert stop.value.code == 2
    assert "argument --fresh: must be an integer from 0 to 2147483647, got -1" in capsys.readouterr().err
    assert main(["reproduce", "--fresh", "1", str(tmp_path / "nope.ipynb"), "--out", str(tmp_path)]) == 2
    assert "no such notebook" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_a_tiny_fresh_draw_runs_end_to_end(tmp_path, capsys):
    """The command on one notebook (05, the quickest with asserted claims): its rows and claims are written, and the
    executed copy drew only the draw's data (``fresh_problems`` refuses the record otherwise)."""
    import json

    from course.__main__ import main
    from course.instructor.exploration import read_provenance
    from course.instructor.fresh_draws import fresh_problems

    out, executed = tmp_path / "draw", tmp_path / "executed"
    assert main(["reproduce", "--fresh", "3", "notebooks/05_snapkv.ipynb", "--out", str(out),
                 "--executed", str(executed)]) == 0
    assert "05_snapkv: " in capsys.readouterr().out
    record = json.loads((out / "05_snapkv.json").read_text())
    assert record["split"] == "fresh:3" and record["fast"] and record["draws"] >= 1
    assert record["claims"] and all(isinstance(c["held"], bool) for c in record["claims"])
    stored = read_provenance(executed / "05_snapkv.ipynb")
    assert stored["claims_recorded"] and fresh_problems(stored, 3) == []
    seeds = [d for d in stored["drawn"] if d["what"] == "seed"]
    assert seeds and all(d["drawn"] >= FRESH_BASE + 3 * SEED_BLOCK for d in seeds)


def test_the_story_passage_is_the_opening_except_in_a_fresh_draw(smollm2):
    from course.data import load_split_text
    from course.passages import CHARS_PER_TOKEN, first_passage

    tok = smollm2[1]
    opening = first_passage(tok, "pride_and_prejudice", 128)
    text = load_split_text("pride_and_prejudice", record=False)[0]
    assert opening.offset == 0 and opening.opening
    assert opening.ids.tolist() == tok(text[:4096], return_tensors="pt").input_ids[:, :128].tolist()
    a, b = (first_passage(tok, "pride_and_prejudice", 128, split=f"fresh:{d}") for d in (1, 2))
    assert a.offset >= CHARS_PER_TOKEN * 128 and not a.opening and a.offset != b.offset
    assert first_passage(tok, "pride_and_prejudice", 128, split="exploration").offset > len(text)
    with pytest.raises(ValueError, match="book must be one of .*got 'ulysses'"):
        first_passage(tok, "ulysses", 128)


def test_what_the_draws_say_of_a_verdict_is_data_not_wording():
    from course.instructor.fresh_tables import EXPLORATORY, HELD, MISSING, SAME, agreement

    cases = [("reproduced", {1: "reproduced", 2: "reproduced"}, HELD, "held on every fresh draw"),
             ("inconclusive", {1: "inconclusive", 2: "inconclusive"}, SAME, "the same verdict (inconclusive)"),
             ("reproduced", {1: "reproduced", 2: "inconclusive"}, EXPLORATORY, "draw 2: inconclusive"),
             ("holds", {1: "holds", 2: None}, MISSING, "not in draw 2"),
             ("holds", {1: "holds"}, MISSING, "not in draw 2")]
    for own, fresh, kind, words in cases:
        said = agreement(own, fresh, [1, 2])
        assert said.kind == kind and words in said.text, (own, fresh, said)
