"""Scientific claims that a notebook asserts about the model that ran.

A notebook's mechanics (a cached decode equals a full forward, the cache holds what its policy keeps)
hold for any weights and are plain ``assert``s. Its *findings* (the first token is a sink, a window
without sinks collapses) are claims about trained models. ``claim`` asserts them on trained weights,
and on an untrained model (``ModelConfig.random_weights``, e.g. ``gpt2-random``, which the course uses
to run every notebook through the GPT-2 code paths offline) prints and records them without raising:

    claim(collapse >= 5, "evicting the first tokens makes perplexity explode", model)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClaimFailed", "Claim", "claim", "RECORDED"]


class ClaimFailed(AssertionError):
    """A finding the notebook expects of a trained model did not hold."""


@dataclass(frozen=True)
class Claim:
    """A claim checked on an untrained model: what it says and whether it held."""

    statement: str
    held: bool
    model: str


RECORDED: list[Claim] = []


def claim(holds: bool, statement: str, model) -> bool:
    """Assert ``statement`` (``holds`` says whether it is true) about ``model`` (a course model or its config).

    Trained weights: raises ``ClaimFailed`` when it does not hold. Random weights: prints whether it held,
    records it in ``RECORDED`` and returns. Returns ``holds``."""
    config = getattr(model, "config", model)
    holds = bool(holds)
    if not getattr(config, "random_weights", False):
        if not holds:
            raise ClaimFailed(f"{config.name}: {statement}")
        return holds
    RECORDED.append(Claim(statement, holds, config.name))
    verdict = "holds" if holds else "does not hold"
    print(f"[{config.name} has random weights: claim recorded, not asserted] {statement} -- {verdict}")
    return holds
