"""The course's notebooks, in order: the one table everything that lists notebooks reads.

A new notebook is its own files (``notebooks/NN_name.ipynb``, ``course/exercises/nbNN.py``) plus one row here.
What reads the table: the exercises that ``course.exercises`` registers, the points per notebook
(``course.instructor.grading.points``, docs/grading.md), the README's table of notebooks (written by
``python -m course release``, checked by ``release --check``), the site's pages and their order
(``course.instructor.site``), the FAST time budget of each notebook (``course.instructor.notebook_times``) and
``python -m course notebooks``. ``tests/test_syllabus.py`` checks that the table and the notebooks on disk agree.

This module imports nothing of the course: both rooms (the student's kernel and the instructor's tools) read it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Notebook", "NOTEBOOKS", "notebooks", "notebook", "FAST_BUDGET_S", "FAST_BUDGET_ALL_S", "readme_table",
           "with_readme_table"]

NAME = re.compile(r"\d\d_[a-z0-9_]+")
MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
FAST_BUDGET_S = 180  # FAST: a notebook within 3 minutes on two cores, unless its row says otherwise
FAST_BUDGET_ALL_S = 900  # FAST: every notebook, one after the other, within 15 minutes on two cores


@dataclass(frozen=True)
class Notebook:
    """One notebook of the course: ``name`` (the file's stem, ``NN_words``), what it ``teaches`` (one line of
    markdown), the module that registers its ``exercises`` ("" when it has none) and its FAST time budget."""

    name: str
    teaches: str
    exercises: str = ""
    fast_budget_s: int = FAST_BUDGET_S

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValueError(f"name must be two digits, an underscore and lower-case words (01_kv_cache), "
                             f"got {self.name!r}")
        if self.exercises and not MODULE.fullmatch(self.exercises):
            raise ValueError(f"exercises must be a module name (course.exercises.nb01) or '', got {self.exercises!r}")
        if self.fast_budget_s < 1:
            raise ValueError(f"fast_budget_s must be >= 1 second, got {self.fast_budget_s}")

    @property
    def number(self) -> str:
        """"01" ...: what exercise ids, submissions and ``--only`` name a notebook by."""
        return self.name[:2]

    @property
    def file(self) -> str:
        return f"{self.name}.ipynb"

    @property
    def page(self) -> str:
        """Its page on the course's site."""
        return f"{self.name}.html"


NOTEBOOKS: tuple[Notebook, ...] = (
    Notebook("01_kv_cache", "what the cache is; cached decode vs recomputation; bytes per token for real models",
             "course.exercises.nb01"),
    Notebook("02_attention_sinks", "where attention goes; the sliding-window collapse and why the first tokens "
             "matter", "course.exercises.nb02"),
    Notebook("03_streaming_llm", "sinks + recent window, position re-assignment, streaming far past the trained "
             "context", "course.exercises.nb03"),
    Notebook("04_h2o", "attention sparsity and heavy hitters; H2O at small budgets; pinning the sink",
             "course.exercises.nb04"),
    Notebook("05_snapkv", "prompt compression from an observation window; needle retrieval vs budget",
             "course.exercises.nb05"),
    Notebook("06_training_a_sink_token", "pretraining tiny models with and without a sink token, a sink logit or "
             "gated attention", "course.exercises.nb06"),
    Notebook("07_choosing_a_policy", "every policy on one model and budget sweep: which to use for which workload",
             "course.exercises.nb07"),
    Notebook("08_quantize_or_evict", "KIVI's quantized cache with the sinks kept exact; eviction, quantization and "
             "both at the same bytes", "course.exercises.nb08"),
    Notebook("09_retrieval_heads", "retrieval heads and streaming heads; a cache whose heads hold different lengths; "
             "DuoAttention, Ada-KV and PyramidKV at the same bytes", "course.exercises.nb09"),
)


def notebooks() -> tuple[Notebook, ...]:
    """The course's notebooks in order (read at each call: every consumer sees the same table)."""
    names = [nb.name for nb in NOTEBOOKS]
    numbers = [nb.number for nb in NOTEBOOKS]
    if len(set(numbers)) != len(numbers) or numbers != sorted(numbers):
        raise ValueError(f"the notebooks' numbers must be different and in order, got {', '.join(names)}")
    return NOTEBOOKS


def notebook(key: str) -> Notebook:
    """The notebook with the number (``"01"``) or name (``"01_kv_cache"``) ``key``."""
    for nb in notebooks():
        if key in (nb.number, nb.name):
            return nb
    raise ValueError(f"unknown notebook {key!r}; the course has {', '.join(nb.name for nb in notebooks())}")


TABLE = re.compile(r"^\| notebook \| teaches \|[^\n]*\n\|---\|---\|[^\n]*\n(?:\|.*\|\n?)*", re.M)
FAST_COLUMN = "FAST, 2 cores"


def readme_table(fast_times: Mapping[str, str] | None = None) -> str:
    """The README's table of notebooks (``| `NN_name` | what it teaches |``), ending with a newline. With
    ``fast_times`` ({name: "1 min 03 s"}, docs/notebook-times.md's FAST column) a third column gives each
    notebook's FAST wall time ("not measured" where it has none)."""
    if fast_times is None:
        rows = [f"| `{nb.name}` | {nb.teaches} |" for nb in notebooks()]
        return "\n".join(["| notebook | teaches |", "|---|---|", *rows]) + "\n"
    rows = [f"| `{nb.name}` | {nb.teaches} | {fast_times.get(nb.name, 'not measured')} |" for nb in notebooks()]
    return "\n".join([f"| notebook | teaches | {FAST_COLUMN} |", "|---|---|---|", *rows]) + "\n"


def with_readme_table(readme: str, fast_times: Mapping[str, str] | None = None) -> str:
    """``readme`` with its table of notebooks replaced by ``readme_table(fast_times)`` (ValueError when it has
    none)."""
    found = TABLE.search(readme)
    if found is None:
        raise ValueError("the README has no table of notebooks (a '| notebook | teaches |' header, then '|---|---|')")
    return readme[: found.start()] + readme_table(fast_times) + readme[found.end():]
