"""Many passages: reproducible sampling, one batch per policy, and the spread."""

from __future__ import annotations

import json

import pytest

from course.__main__ import main
from course.passages import sample_passages, spread, stream_passages
from course.policies import make_policy


def test_spread_summarises_and_refuses_anecdotes():
    s = spread([1.0, 2.0, 3.0, 10.0])
    assert (s.median, s.mean, s.low, s.high) == (2.5, 4.0, 1.0, 10.0)
    assert s.ci is None and "interval 1" not in str(s) and "1, 2, 3, 10" in str(s)
    assert "too few for a 95% interval of the median" in str(s)
    assert "probability 1 - 2^(1-n) = 88%" in str(s)  # the range of 4 values covers the median 7 times in 8
    s6 = spread([1.0, 2.0, 3.0, 10.0, 4.0, 5.0])  # from 6 values on: the range covers the median 97 % of the time
    assert s6.ci == (1.0, 10.0) and "97% interval 1-10" in str(s6)
    s9 = spread([1.0, 2.0, 3.0, 10.0, 4.0, 5.0, 6.0, 7.0, 8.0])  # from 9: the 2nd smallest to the 2nd largest
    assert s9.ci == (2.0, 8.0) and "96% interval 2-8" in str(s9)
    assert s.share(lambda v: v > 2) == 0.5
    with pytest.raises(ValueError, match="at least two"):
        spread([1.0])


def test_passages_are_reproducible_openings_then_paragraph_starts(smollm2):
    tok = smollm2[1]
    a = sample_passages(tok, 8, 64, seed=1)
    b = sample_passages(tok, 8, 64, seed=1)
    c = sample_passages(tok, 8, 64, seed=2)
    assert [(p.book, p.offset) for p in a] == [(p.book, p.offset) for p in b] != [(p.book, p.offset) for p in c]
    assert [p.offset for p in a[:4]] == [0] * 4 and len({p.book for p in a[:4]}) == 4  # half are openings
    assert all(p.offset > 0 and p.ids.shape == (1, 64) for p in a[4:])
    assert [p.offset for p in sample_passages(tok, 8, 64, openings=6)[:6]] == [0] * 6
    with pytest.raises(ValueError, match="one passage is an anecdote"):
        sample_passages(tok, 1, 64)


def test_stream_passages_equals_one_stream_per_passage(smollm2):
    from course.streaming import exact_stream

    model, tok, _ = smollm2
    passages = sample_passages(tok, 3, 96, seed=0)
    out = stream_passages(model, passages, {"w": make_policy("window", 32, model=model)}, start=32, progress=False)
    for p, ppl in zip(passages, out["w"]):
        alone = exact_stream(model, p.ids, make_policy("window", 32, model=model), progress=False)
        assert ppl == pytest.approx(alone.ppl(32), rel=1e-4)


def test_stream_passages_from_the_command_line(capsys):
    assert main(["stream", "--policy", "window", "--budget", "32", "--tokens", "96", "--passages", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["passages"]) == 3 and out["scored_from"] == 32
    values = sorted(p["ppl"] for p in out["passages"])
    assert out["ppl"]["median"] == values[1] and out["ppl"]["min"] == values[0]
    assert main(["stream", "--passages", "3", "--book", "emma", "--tokens", "64"]) == 2
    assert "--passages draws from all six" in capsys.readouterr().err
