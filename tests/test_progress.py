"""The shared progress bar: live it redraws rarely, as text it leaves whole lines ending at 100 %,
and it can be silenced (see course.progress)."""

import re

import pytest

from course import progress
from course.progress import REDRAWS, library_bars, progress_bar, progress_mode


def test_progress_bar_redraws_at_most_redraws_times():
    with progress_bar(range(10_000), desc="t") as bar:
        assert bar.miniters == 10_000 // REDRAWS
        assert bar.mininterval >= 1.0
        assert sum(1 for _ in bar) == 10_000


def test_progress_bar_disabled_still_iterates_and_updates():
    assert list(progress_bar(range(5), enabled=False)) == [0, 1, 2, 3, 4]
    with progress_bar(total=3, enabled=False) as bar:
        bar.update(3)


def test_progress_bar_small_totals_redraw_every_step():
    with progress_bar(range(7)) as bar:
        assert bar.miniters == 1


# ----------------------------------------------------------------------------- modes


@pytest.fixture
def mode(monkeypatch):
    """Set COURSE_PROGRESS for one test (None: unset)."""
    def set_mode(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv("COURSE_PROGRESS", raising=False)
        else:
            monkeypatch.setenv("COURSE_PROGRESS", value)
    return set_mode


def test_text_bars_print_whole_lines_that_end_at_100_percent(mode, monkeypatch, capsys):
    mode("text")
    monkeypatch.setattr(progress, "TEXT_INTERVAL", 0.0)  # a line for every step: a long loop, in short
    for _ in progress_bar(range(4), desc="steps"):
        pass
    with progress_bar(total=3, desc="by hand") as bar:
        bar.update(3)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "\r" not in out and not re.search(r"(?<!\d)0%\|", out)  # no bar that has not moved
    assert [ln.split("|")[0] for ln in lines] == ["steps:  25%", "steps:  50%", "steps:  75%", "steps: 100%",
                                                 "by hand: 100%"]


def test_text_bars_of_short_loops_print_only_their_end(mode, capsys):
    mode("text")
    for _ in progress_bar(range(1000), desc="short", leave=False):
        pass
    assert [ln.split("|")[0] for ln in capsys.readouterr().out.splitlines()] == ["short: 100%"]


def test_off_prints_nothing_and_still_iterates(mode, capsys):
    mode("off")
    assert sum(1 for _ in progress_bar(range(5), desc="x")) == 5
    captured = capsys.readouterr()
    assert captured.out == captured.err == ""


def test_auto_is_text_in_a_kernel_nobody_watches(mode, monkeypatch):
    mode(None)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.delenv("VSCODE_PID", raising=False)
    assert progress_mode() == "live"  # a terminal: tqdm's own text bar
    monkeypatch.setattr(progress, "_in_kernel", lambda: True)
    assert progress_mode() == "text"  # papermill, nbclient, nbval
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/01_kv_cache.ipynb")
    assert progress_mode() == "live"  # JupyterLab
    mode("text")
    assert progress_mode() == "text"


def test_a_bad_mode_is_named_with_the_allowed_values(mode):
    mode("quiet")
    with pytest.raises(ValueError, match=r"COURSE_PROGRESS must be one of auto, live, text, off; got 'quiet'"):
        progress_bar(range(3))


def test_library_bars_are_off_unless_live_and_restored_after(mode):
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    mode("text")
    with library_bars():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
    mode("live")
    with library_bars():
        assert hf_logging.is_progress_bar_enabled()
