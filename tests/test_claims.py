"""Claims: asserted on trained weights, recorded without raising on untrained ones."""

from __future__ import annotations

import pytest

from course.claims import RECORDED, ClaimFailed, claim

from .conftest import tiny_config


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
