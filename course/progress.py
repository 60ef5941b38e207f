"""One progress bar for every long loop in the course, live or as plain text.

In Jupyter, ``tqdm.auto`` draws a widget, and every redraw sends a few messages from the kernel
to the front end. A bar that redraws ten times a second during a ten-minute training run sends
thousands of them; the kernel's outgoing queue holds about a thousand, and what overflows is
dropped (in a notebook executed as a test, possibly the message that says the cell finished).
So live bars redraw at most ``REDRAWS`` times in all and at most once a second.

A notebook executed without anyone watching (papermill, nbval, the autograder) keeps only the
widget's first frame, a frozen ``0%|`` bar. There the bar is plain text instead: one line at most
every ``TEXT_INTERVAL`` seconds and a last line at 100 %, no carriage returns, nothing for loops
shorter than that. ``COURSE_PROGRESS`` chooses (see ``progress_mode``):

* ``auto`` (default): live where a person watches (a terminal, JupyterLab or Notebook, Colab,
  VS Code), text in a kernel started by anything else (papermill, nbclient, nbval);
* ``live``: ``tqdm.auto`` always; ``text``: plain text always; ``off``: no bars.

The libraries' own bars (transformers' "Loading weights") follow the same choice: they are shown
only live (``library_bars``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

__all__ = ["progress_bar", "progress_mode", "library_bars", "REDRAWS", "TEXT_INTERVAL", "PROGRESS_ENV",
           "PROGRESS_MODES"]

REDRAWS = 50
TEXT_INTERVAL = 60.0  # seconds between two lines of a text bar
PROGRESS_ENV = "COURSE_PROGRESS"
PROGRESS_MODES = ("auto", "live", "text", "off")


def _watched_kernel() -> bool:
    """Is this an IPython kernel that a person's front end started? JupyterLab and Notebook (their
    server names the session in ``JPY_SESSION_NAME``), Colab and VS Code are; papermill, nbclient
    and nbval start kernels without any of these marks."""
    return bool(os.environ.get("JPY_SESSION_NAME") or os.environ.get("VSCODE_PID")
                or "google.colab" in sys.modules)


def _in_kernel() -> bool:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell is not None and hasattr(shell, "kernel")


def progress_mode() -> str:
    """How bars are drawn here: "live" (``tqdm.auto``), "text" or "off", from ``COURSE_PROGRESS``
    (auto, live, text or off; auto: live in a terminal or a watched kernel, otherwise text)."""
    value = os.environ.get(PROGRESS_ENV, "").strip().lower() or "auto"
    if value not in PROGRESS_MODES:
        raise ValueError(f"{PROGRESS_ENV} must be one of {', '.join(PROGRESS_MODES)}; got {value!r}")
    if value == "auto":
        return "text" if _in_kernel() and not _watched_kernel() else "live"
    return value


class _Lines:
    """The file a text bar writes to: every redraw becomes one whole line (no carriage return),
    and the blank writes tqdm uses to clear a line are dropped."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, s: str) -> None:
        text = s.replace("\r", "").strip()
        if text:
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _text_bar_class():
    from tqdm.std import tqdm

    class TextBar(tqdm):
        """tqdm's text bar that never draws a bar that has not moved (no ``0%|`` lines) and does not
        draw its last state twice when closed."""

        def display(self, msg=None, pos=None):
            closing = self.disable  # tqdm.close sets it before the last draw
            if msg is None and (self.n == 0 and not closing or closing and getattr(self, "_drawn", None) == self.n):
                return True
            self._drawn = self.n
            return super().display(msg, pos)

    return TextBar


def progress_bar(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
                 unit: str = "it", enabled: bool = True, leave: bool = False, **kwargs):
    """A progress bar over ``iterable`` (or updated by hand up to ``total``) drawn as ``progress_mode``
    says: live, at most ``REDRAWS`` redraws and at most one a second; or as text lines, at most one
    every ``TEXT_INTERVAL`` seconds, always ending with the last state (``leave`` is ignored there);
    or not at all.

    ``total`` defaults to ``len(iterable)``; ``enabled=False`` gives a silent bar with the same
    interface. Extra keyword arguments go to tqdm (``unit_scale`` …)."""
    mode = progress_mode()
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    miniters = max(1, (total or 0) // REDRAWS)
    common = dict(total=total, desc=desc, unit=unit, disable=not enabled or mode == "off", miniters=miniters)
    if mode == "text":
        return _text_bar_class()(iterable, file=_Lines(sys.stdout), leave=True, mininterval=TEXT_INTERVAL,
                                 ascii=False, dynamic_ncols=False, ncols=100, **common, **kwargs)
    from tqdm.auto import tqdm

    return tqdm(iterable, leave=leave, mininterval=1.0, **common, **kwargs)


@contextmanager
def library_bars() -> Iterator[None]:
    """Within this block, transformers' and the Hugging Face hub's own bars (loading weights,
    downloads) are shown only when ``progress_mode()`` is live; their setting is restored after."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if progress_mode() == "live":
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
