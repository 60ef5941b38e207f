"""One progress bar for every long loop in the course.

In Jupyter, ``tqdm.auto`` draws a widget, and every redraw sends a few messages from the kernel
to the front end. A bar that redraws ten times a second during a ten-minute training run sends
thousands of them; the kernel's outgoing queue holds about a thousand, and what overflows is
dropped (in a notebook executed as a test, possibly the message that says the cell finished).
So the bars here redraw at most ``REDRAWS`` times in all and at most once a second.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["progress_bar", "REDRAWS"]

REDRAWS = 50


def progress_bar(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
                 unit: str = "it", enabled: bool = True, leave: bool = False, **kwargs):
    """A ``tqdm.auto`` bar that redraws at most ``REDRAWS`` times and at most once a second.

    ``total`` defaults to ``len(iterable)``; ``enabled=False`` gives a silent bar with the same
    interface. Extra keyword arguments go to tqdm (``unit_scale`` …)."""
    from tqdm.auto import tqdm

    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    miniters = max(1, (total or 0) // REDRAWS)
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=not enabled, leave=leave,
                mininterval=1.0, miniters=miniters, **kwargs)
