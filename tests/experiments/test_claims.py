"""Claims: asserted on trained weights, recorded without raising on untrained ones."""

from __future__ import annotations

import pytest

from course.claims import RECORDED, ClaimFailed, claim, report

from tests.conftest import tiny_config


def test_a_claim_is_asserted_on_a_trained_model():
    trained = tiny_config("gpt2")
    assert claim(True, "holds", trained) is True
    with pytest.raises(ClaimFailed, match="tiny-gpt2: the first token is a sink"):
        claim(False, "the first token is a sink", trained)


def test_a_claim_is_recorded_on_a_random_model(capsys):
    untrained = tiny_config("gpt2", random_weights=True, name="gpt2-random")
    before = len(RECORDED)
    assert claim(False, "the first token is a sink", untrained) is False
    assert RECORDED[before:] == [type(RECORDED[before])("the first token is a sink", False, "gpt2-random")]
    assert "claim recorded, not asserted] the first token is a sink -- does not hold" in capsys.readouterr().out


def test_a_report_prints_holds_or_not_never_reproduced_and_never_raises(capsys):
    from course.claims import REPRODUCTIONS

    trained = tiny_config("gpt2")
    before = len(RECORDED)
    assert report(False, "H2O at 20% stays within 15% of dense", trained, "median ratio 1.31") is False
    assert report(True, "the sink is kept", trained, "30 of 30 heads", notebook="98", n=4) is True
    out = capsys.readouterr().out
    assert "within 15% of dense -- does not hold (median ratio 1.31)" in out
    assert "the sink is kept -- holds (30 of 30 heads)" in out and "reproduced" not in out
    assert [c.held for c in RECORDED[before:]] == [False, True]
    row = [r for r in REPRODUCTIONS if r.notebook == "98"]
    assert [(r.kind, r.verdict, r.n) for r in row] == [("finding", "holds", 4)]
    from course.claims import show_reproductions

    show_reproductions("98")
    assert "Here: yes (n = 4)" in capsys.readouterr().out
    REPRODUCTIONS[:] = [r for r in REPRODUCTIONS if r.notebook != "98"]


def test_every_verdict_is_judged_on_an_interval_and_straddling_is_inconclusive():
    from course.claims import Rule
    from course.stats import interval

    assert interval([1.0, 3.0, 2.0]).how == "range" and (interval([1.0, 3.0, 2.0]).low, interval([1.0, 3.0]).high) \
        == (1.0, 3.0)
    many = interval([float(v) for v in range(1, 10)])    # 9 values: the 2nd smallest to the 2nd largest, 96 %
    assert (many.how, many.n, many.low, many.high) == ("order-statistic interval", 9, 2.0, 8.0)
    assert interval(4.2).n == 1 and interval(4.2).how == "one value"
    assert interval([0, 1, 1, 1], "mean").point == 0.75 and "nominal 95%" in str(interval([0, 1, 1, 1], "mean"))
    up = Rule("window only / sinks", at_least=10, partly=2)
    assert up.verdict([12, 15, 11, 20, 13])[0] == "reproduced"
    assert up.verdict([3, 4, 9, 5, 6])[0] == "partly"
    assert up.verdict([1, 1.5, 1.2, 0.9, 1])[0] == "not reproduced at this scale"
    verdict, reason = up.verdict([8, 30, 40, 50, 60])          # median 40, but one passage below 10
    assert verdict == "inconclusive at n = 5" and "straddles 10" in reason
    assert up.verdict([1.5, 3])[0] == "inconclusive at n = 2"   # across the partly bound
    verdict, reason = up.verdict([12, 15, 11])                  # every value clears 10, but 3 are too few
    assert verdict == "inconclusive at n = 3" and "the whole interval >= 10" in reason and "needs 5" in reason \
        and "75%" in reason
    assert up.verdict(12.0)[0] == "reproduced"                   # one exact value (arithmetic) is judged as it is
    assert up.verdict(None) == ("not reproduced at this scale", "window only / sinks: no number was measured")
    down = Rule("sinks / dense", at_most=1.05)
    assert down.verdict([0.98, 1.0, 1.04, 1.01, 0.99])[0] == "reproduced"
    assert down.verdict([1.0, 1.2])[0].startswith("inconclusive")


def test_the_median_interval_covers_as_often_as_it_says():
    """The order-statistic interval's stated coverage is its true coverage, at every n a notebook uses, for a
    skewed distribution too (where a percentile bootstrap of the median falls short)."""
    import math
    import random

    from course.stats import LEVEL, bootstrap_interval, interval, order_coverage

    assert [round(order_coverage(n, 1), 4) for n in (2, 5, 6)] == [0.5, 0.9375, 0.9688]
    assert round(order_coverage(9, 2), 4) == 0.9609 and round(order_coverage(8, 2), 4) == 0.9297
    assert all(interval([float(v) for v in range(n)]).coverage >= LEVEL for n in range(6, 40))
    rng = random.Random(1)
    median = math.log(2)  # of the exponential distribution with rate 1
    for n in (6, 8, 9, 12, 20):
        draws = [[rng.expovariate(1.0) for _ in range(n)] for _ in range(3000)]
        ivs = [interval(d) for d in draws]
        hits = sum(iv.low <= median <= iv.high for iv in ivs) / len(draws)
        assert abs(hits - ivs[0].coverage) < 0.02, (n, hits, ivs[0].coverage)
    boot = [bootstrap_interval(d, resamples=400) for d in draws[:400]]  # n = 20: below its nominal 95 %? say so
    assert sum(lo <= median <= hi for lo, hi in boot) / 400 < 0.97
    with pytest.raises(ValueError, match="k must be an integer from 1 to n // 2 = 3"):
        order_coverage(6, 4)


def test_the_three_kinds_of_row_are_kept_apart(capsys):
    from course.claims import REPRODUCTIONS, Rule, finding, illustration, reproduction, show_reproductions

    trained = tiny_config("gpt2")
    rule = Rule("no sinks / 4 sinks", at_least=10, partly=2)
    reproduction("97", "streamingllm.table2.llama2", "350x", [20, 30, 40], rule, trained, "3 passages")
    shown = illustration("97", "streamingllm.table7", "0.00 beyond the cache", 0.0, "recall beyond the cache",
                         trained, "2 passkeys", why="true by construction: an evicted token cannot be recalled")
    assert shown.kind == "illustration" and "reproduced" not in shown.verdict
    own = finding("97", "H2O beats StreamingLLM at 5 %", [0.8, 0.9, 0.7, 0.85, 0.75],
                  Rule("H2O / StreamingLLM", at_most=0.95), trained, "5 passages")
    assert own.kind == "finding" and own.verdict == "holds" and own.source.startswith("the course's own")
    with pytest.raises(ValueError, match="no partly"):
        finding("97", "x", [1.0], rule, trained, "")
    rows = show_reproductions("97")
    out = capsys.readouterr().out
    assert [r.kind for r in rows] == ["reproduction", "illustration", "finding"]
    assert "Illustrations (shown beside a paper's number, not counted)" in out and "n = 3" in out
    REPRODUCTIONS[:] = [r for r in REPRODUCTIONS if r.notebook != "97"]


def test_first_token_ablation_zeroes_the_value_and_hides_the_key(family):
    import torch

    from course.attention_analysis import first_token_ablation, residual_norms, value_norms

    from tests.conftest import tiny_model

    model = tiny_model(family, dtype=torch.float32)
    ids = torch.randint(0, 97, (1, 40))
    out = first_token_ablation(model, ids, after=8)
    assert set(out) == {"normal", "zero_value", "no_key"}
    assert out["zero_value"] != out["normal"] and out["no_key"] != out["normal"]
    with torch.no_grad():  # after the ablation the model is unchanged
        logits = model(ids[:, :-1]).logits
    nll = torch.nn.functional.cross_entropy(logits[0, 8:].double(), ids[0, 9:])
    assert abs(out["normal"] - float(nll.exp())) < 1e-4 * out["normal"]
    assert residual_norms(model, ids).shape == (2, 40) and value_norms(model, ids).shape == (2, 40)
    from course.attention_analysis import activation_peaks

    peaks = activation_peaks(model, ids)                 # per layer: token 0's largest activation / the median one
    assert peaks.shape == (2,) and bool((peaks > 0).all())
    from course.attention_analysis import _first_value_zeroed

    with _first_value_zeroed(model):
        zeroed = value_norms(model, ids)
    assert torch.all(zeroed[:, 0] == 0)  # in every layer
    assert torch.allclose(zeroed[0, 1:], value_norms(model, ids)[0, 1:])  # the first layer: nothing else changed


def test_every_interval_states_its_coverage_and_a_claim_is_judged_on_its_bound(capsys):
    import random

    from course.stats import bound, interval, order_coverage, range_coverage

    assert [range_coverage(n) for n in (2, 3, 5)] == [0.5, 0.75, 0.9375]
    assert "coverage 88%" in str(interval([1.0, 2.0, 3.0, 4.0]))
    assert interval([1.0] * 9).coverage == order_coverage(9, 2)
    rng = random.Random(0)  # the range of 3 draws covers the median (0) about 3 times in 4
    hits = sum(min(x) <= 0 <= max(x) for x in ([rng.gauss(0, 1) for _ in range(3)] for _ in range(4000)))
    assert abs(hits / 4000 - 0.75) < 0.03
    b = bound([1.0, 1.2, 1.5, 1.1], at_most=1.3)  # the median 1.15 is under 1.3, the interval's top is not
    assert not b.held and b.bound == 1.5 and "rests on n = 4 < 5" in capsys.readouterr().out
    assert bound([2.0, 2.5, 3.0, 2.2, 2.8], at_least=2).held and "rests on" not in capsys.readouterr().out
    with pytest.raises(ValueError, match="exactly one of at_most= or at_least="):
        bound([1.0, 2.0])


def test_an_exploration_run_records_claims_instead_of_asserting(monkeypatch, capsys):
    from types import SimpleNamespace

    trained = SimpleNamespace(name="m", random_weights=False)
    monkeypatch.setenv("COURSE_CLAIMS", "record")
    assert claim(False, "a sink forms", trained, figure=0.42) is False
    assert RECORDED[-1].figure == 0.42 and "exploration run" in capsys.readouterr().out
    monkeypatch.setenv("COURSE_CLAIMS", "maybe")
    with pytest.raises(ValueError, match="COURSE_CLAIMS must be 'assert' or 'record'"):
        claim(True, "x", trained)


def test_a_paired_comparison_is_tested_exactly_on_the_prompts_that_differ():
    from course.stats import paired

    same = paired([True, False, True], [True, False, True])
    assert (same.both, same.only_first, same.only_second, same.neither, same.p) == (2, 0, 0, 1, 1.0)
    five = paired([True] * 5 + [False], [False] * 5 + [False])   # 5 prompts all one way: p = 2 / 32, not below 0.05
    assert five.discordant == 5 and five.p == 0.0625
    six = paired([True] * 6, [False] * 6)
    assert six.p == 0.03125 and "only the first 6" in str(six) and "p = 0.0312" in str(six)
    split = paired([True, True, False, True], [False, True, True, False])  # 2 against 1: p = 2 (1 + 3) / 8 > 1 -> 1
    assert (split.only_first, split.only_second, split.p) == (2, 1, 1.0)
    with pytest.raises(ValueError, match="one outcome per prompt"):
        paired([True], [True, False])
