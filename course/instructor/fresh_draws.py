"""Fresh draws: ``python -m course reproduce --fresh SEED [NOTEBOOK ...]``.

A verdict chosen and asserted on the same data says little about data nobody has seen. A fresh draw re-runs every
asserted claim and every row of notebooks 02-09 on data drawn after their rules were fixed (``course.splits``:
split ``"fresh:SEED"``): passages at paragraph starts drawn from SEED in the confirmation characters, never an
opening nor a passage the same call reads on the confirmation split (another call's passage can overlap one), never
the exploration characters; needles, passkeys, random fills and
notebook 06's trained models from seeds of SEED's own stream. The notebooks' rules and thresholds stay where they
are: the executed copies (FAST, claims recorded instead of asserted) go to ``outputs-fresh/<SEED>/`` and each
notebook's rows and claims to ``docs/fresh/<SEED>/<notebook>.json`` (the record of ``python -m course explore``).
``python -m course reproductions`` reads the draws beside the notebooks' own runs and says, row by row, whether
a verdict held on every draw.

    python -m course reproduce --fresh 1                  # notebooks 02-09, about 20 minutes on two cores
    python -m course reproduce --fresh 1 notebooks/05_snapkv.ipynb --out /tmp/draw
"""

from __future__ import annotations

from pathlib import Path

from course.instructor.exploration import check_notebooks, in_confirmation_text, split_record
from course.instructor.fresh_tables import FRESH_DIR

__all__ = ["FRESH_DIR", "NOTEBOOKS", "fresh_problems", "draw_notebook", "fresh_draw_run"]

NOTEBOOKS = "0[2-9]_*.ipynb"  # the notebooks with asserted claims (01's are mechanics: true for any data)


def fresh_problems(stored: dict, seed: int) -> list[str]:
    """Why an executed notebook's stored draws are not fresh draw ``seed``'s alone: a draw of another split, a seed
    outside the draw's stream, or characters outside the confirmation share of a novel. (That no passage is one
    the notebooks read on the confirmation split is ``course.passages.sample_passages``'s to keep.)"""
    from course.splits import FRESH_BASE, SEED_BLOCK, fresh_split

    split = fresh_split(seed)
    problems = [] if stored.get("split") == split else [f"ran on the {stored.get('split')} split, not {split}"]
    if not stored.get("drawn"):
        problems.append("no record of the data it drew")
    low = FRESH_BASE + seed * SEED_BLOCK
    for d in stored.get("drawn", []):
        if d["split"] != split:
            problems.append(f"drew {d['split']} data: {d}")
        elif d["what"] == "seed" and not low <= d["drawn"] < low + SEED_BLOCK:
            problems.append(f"a seed outside fresh draw {seed}'s stream: {d}")
        elif d["what"] == "text" and not in_confirmation_text(d):
            problems.append(f"characters outside the confirmation share: {d}")
    return problems


def draw_notebook(path: Path, seed: int, executed_dir: Path, out_dir: Path, timeout: int | None = None) -> dict:
    """Execute ``path`` (FAST, claims recorded) on fresh draw ``seed`` into ``executed_dir`` and write
    ``out_dir/<stem>.json``; refused (``ValueError``) when it drew anything but that draw's data."""
    from course.splits import fresh_split

    env = {"COURSE_SPLIT": fresh_split(seed), "COURSE_CLAIMS": "record"}
    return split_record(path, executed_dir, out_dir, env, lambda stored: fresh_problems(stored, seed), timeout)


def fresh_draw_run(seed: int, notebooks: list[Path], executed_dir: Path, out_dir: Path,
                   timeout: int | None = None, progress: bool = True) -> list[dict]:
    """``draw_notebook`` for each notebook, one after the other, with a progress bar over the notebooks."""
    from course.progress import progress_bar
    from course.splits import fresh_split

    fresh_split(seed)  # checked before anything runs
    check_notebooks(notebooks, executed_dir)
    records = []
    bar = progress_bar(notebooks, desc=f"fresh draw {seed}", unit="notebook", enabled=progress)
    for path in bar:
        bar.set_postfix_str(Path(path).stem)
        records.append(draw_notebook(Path(path), seed, Path(executed_dir), Path(out_dir), timeout))
    return records
