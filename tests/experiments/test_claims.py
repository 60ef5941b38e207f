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


def test_a_report_prints_the_verdict_with_the_numbers_and_never_raises(capsys):
    trained = tiny_config("gpt2")
    before = len(RECORDED)
    assert report(False, "H2O at 20% stays within 15% of dense", trained, "median ratio 1.31") is False
    assert report(True, "the sink is kept", trained, "30 of 30 heads") is True
    out = capsys.readouterr().out
    assert "within 15% of dense -- not reproduced at this scale (median ratio 1.31)" in out
    assert "the sink is kept -- reproduced (30 of 30 heads)" in out
    assert [c.held for c in RECORDED[before:]] == [False, True]


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
    from course.attention_analysis import _first_value_zeroed

    with _first_value_zeroed(model):
        zeroed = value_norms(model, ids)
    assert torch.all(zeroed[:, 0] == 0)  # in every layer
    assert torch.allclose(zeroed[0, 1:], value_norms(model, ids)[0, 1:])  # the first layer: nothing else changed
