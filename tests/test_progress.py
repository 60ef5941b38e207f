"""The shared progress bar redraws rarely (see course.progress) and can be silenced."""

from course.progress import REDRAWS, progress_bar


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
