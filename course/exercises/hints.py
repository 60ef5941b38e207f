"""The feedback of a build exercise points to the notebook's hint for the mistake it found.

Every build exercise has three hints below it in the notebook, each folded until the student opens it:
Hint 1, what to compute; Hint 2, the shapes; Hint 3, the pitfall. A checker's message ends with the hint that
matches what it saw, so the student reads the right one first.
"""

from __future__ import annotations

__all__ = ["HINTS", "hint"]

HINTS = {1: "what to compute", 2: "the shapes", 3: "the pitfall"}


def hint(number: int, text: str) -> str:
    """``text``, followed by the pointer to the notebook's hint ``number``."""
    if number not in HINTS:
        raise ValueError(f"number must be one of {sorted(HINTS)}, got {number!r}")
    return f"{text} (see Hint {number}, {HINTS[number]}, below the exercise)"
