"""Exploration and confirmation apart: the data a threshold is chosen on is never the data it is asserted on.

Every number the course asserts comes from a *confirmation* run; every threshold was chosen from an
*exploration* run (``python -m course explore``) on data the confirmation run never reads:

* **text**: the last ``EXPLORATION_SHARE`` of every Austen novel's characters is exploration, the rest
  (with the openings the notebooks teach on) confirmation (``split_range``);
* **seeds** (passkeys, needles, random fills, trained models): a base seed ``s`` (0 <= s < ``SEED_BLOCK``) is
  ``s`` itself in confirmation and ``s + SEED_BLOCK`` in exploration (``split_seed``), so that the two never
  draw from the same stream.

A third kind of split re-runs the asserted claims on data drawn after the rules were fixed, which nobody has looked
at: a **fresh draw** ``"fresh:N"`` (``fresh_split(N)``, ``python -m course reproduce --fresh N``). It reads the
confirmation characters, takes no opening and no passage that the confirmation split gives the same call
(``course.passages``; a passage another call of the notebooks reads can still overlap one), and its base seed ``s``
becomes ``FRESH_BASE + N * SEED_BLOCK + s``: a stream of its own for every draw, apart from both splits above.

The split in force is the environment's ``COURSE_SPLIT`` ("confirmation" unless set). Every draw is written
down (``DRAWN``: which split, which characters of which novel, which seed) and stored with the notebook's
reproduction rows, so that a test can read in an executed notebook that it drew only confirmation data.

    split_range(len(text))                # (0, 0.8 * len): the confirmation characters of a novel
    split_seed(7, "exploration")          # 2147483655
    split_seed(7, fresh_split(1))         # 6442450951 = 2**32 + 1 * 2**31 + 7
"""

from __future__ import annotations

import os

__all__ = ["SPLITS", "SPLIT_ENV", "EXPLORATION_SHARE", "SEED_BLOCK", "FRESH_BASE", "GENERATOR_SEED_MAX", "DRAWN",
           "current_split", "check_split", "fresh_split", "fresh_draw", "split_range", "split_seed", "record_text",
           "drawn"]

SPLITS = ("exploration", "confirmation")
SPLIT_ENV = "COURSE_SPLIT"
EXPLORATION_SHARE = 0.2  # the last fifth of each novel's characters: far from the openings the notebooks teach on
SEED_BLOCK = 2**31       # base seeds 0 .. 2**31 - 1; exploration adds this, so the two ranges never meet
FRESH = "fresh"
FRESH_BASE = 2 * SEED_BLOCK  # fresh draw N's seeds: FRESH_BASE + N * SEED_BLOCK + s, above both splits' seeds
GENERATOR_SEED_MAX = FRESH_BASE + SEED_BLOCK * SEED_BLOCK - 1  # the largest seed split_seed hands a generator (< 2**63)

#: every draw of this process, in order: {"split", "what": "text", "source", "start", "end"} (characters) or
#: {"split", "what": "seed", "seed", "drawn"} (the base seed and the one the generator got)
DRAWN: list[dict] = []


def fresh_split(draw: int) -> str:
    """The name of fresh draw ``draw`` (0 <= draw < ``SEED_BLOCK``): ``"fresh:<draw>"``."""
    if isinstance(draw, bool) or not isinstance(draw, int) or not 0 <= draw < SEED_BLOCK:
        raise ValueError(f"the fresh draw's seed must be an integer from 0 to {SEED_BLOCK - 1}, got {draw!r}")
    return f"{FRESH}:{draw}"


def fresh_draw(split: str) -> int | None:
    """The draw of a fresh split (``"fresh:7"`` -> 7); None for exploration and confirmation. Raises on anything
    else."""
    if split in SPLITS:
        return None
    name, colon, draw = str(split).partition(":")
    if name != FRESH or not colon or not draw.isdigit() or int(draw) >= SEED_BLOCK:
        raise ValueError(f"split must be one of {', '.join(SPLITS)} or '{FRESH}:N' (a fresh draw, N from 0 to "
                         f"{SEED_BLOCK - 1}), got {split!r}")
    return int(draw)


def current_split() -> str:
    """The split in force: the environment's ``COURSE_SPLIT`` ("confirmation" when unset or empty)."""
    value = os.environ.get(SPLIT_ENV, "").strip() or "confirmation"
    try:
        fresh_draw(value)
    except ValueError:
        raise ValueError(f"{SPLIT_ENV} must be one of {', '.join(SPLITS)} or '{FRESH}:N' (a fresh draw, N from 0 to "
                         f"{SEED_BLOCK - 1}; or unset: confirmation), got {value!r}") from None
    return value


def check_split(split: str | None) -> str:
    """``split`` checked (None: the split in force, ``current_split``)."""
    if split is None:
        return current_split()
    if not isinstance(split, str):
        raise ValueError(f"split must be one of {', '.join(SPLITS)} or '{FRESH}:N' (or None: ${SPLIT_ENV}), "
                         f"got {split!r}")
    fresh_draw(split)
    return split


def split_range(length: int, split: str | None = None) -> tuple[int, int]:
    """The characters ``[start, end)`` of a text of ``length`` characters that ``split`` may read: confirmation
    the first ``1 - EXPLORATION_SHARE`` (the opening included), exploration the rest. The two never overlap. A
    fresh draw reads the confirmation characters (away from the same call's passages: ``course.passages``)."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ValueError(f"length must be an integer >= 2 (characters of a text), got {length!r}")
    cut = int(length * (1 - EXPLORATION_SHARE))
    return (cut, length) if check_split(split) == "exploration" else (0, cut)


def split_seed(seed: int, split: str | None = None, record: bool = True) -> int:
    """The seed a generator gets for base seed ``seed`` (0 <= seed < ``SEED_BLOCK``) in ``split``: the seed
    itself in confirmation, ``seed + SEED_BLOCK`` in exploration, ``FRESH_BASE + N * SEED_BLOCK + seed`` in fresh
    draw N. ``record``: write it down in ``DRAWN`` (a seed only computed, never drawn from, is not)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_BLOCK:
        raise ValueError(f"seed must be an integer from 0 to {SEED_BLOCK - 1} (a base seed; the exploration split "
                         f"adds {SEED_BLOCK}), got {seed!r}")
    split = check_split(split)
    draw = fresh_draw(split)
    if draw is not None:
        out = FRESH_BASE + draw * SEED_BLOCK + seed
    else:
        out = seed + (SEED_BLOCK if split == "exploration" else 0)
    if record:
        DRAWN.append({"split": split, "what": "seed", "seed": seed, "drawn": out})
    return out


def record_text(source: str, start: int, end: int, split: str) -> None:
    """Write down that characters ``[start, end)`` of ``source`` (e.g. "austen/emma") were read for ``split``."""
    DRAWN.append({"split": check_split(split), "what": "text", "source": source, "start": int(start), "end": int(end)})


def drawn() -> list[dict]:
    """The draws of this process so far, deduplicated, in order (what a notebook stores with its rows)."""
    seen, out = set(), []
    for d in DRAWN:
        key = tuple(sorted(d.items()))
        if key not in seen:
            seen.add(key)
            out.append(dict(d))
    return out
