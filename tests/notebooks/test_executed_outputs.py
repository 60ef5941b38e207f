"""A small notebook (progress bars, a model loaded by transformers, both explorers on a tiny model)
executed without a front end, the way the scripts and test runners do, reads cleanly: no frozen
progress bar, no widget text, no "Loading weights" (course.instructor.output_check). The same notebook run with
live bars shows what the checker is there to catch."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from course.instructor.notebook_times import execute_notebook
from course.instructor.output_check import check_notebook, output_texts

pytestmark = pytest.mark.slow  # kernels, notebooks or the real model at length: not in the contributor suite

ROOT = Path(__file__).resolve().parents[2]
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}

CELLS = [
    "FAST = False",
    """import time
import course.progress
from course.progress import progress_bar
course.progress.TEXT_INTERVAL = 0.05  # several lines, as a long loop would print
for _ in progress_bar(range(20), desc="loop"):
    time.sleep(0.01)
with progress_bar(total=10, desc="by hand") as bar:
    bar.update(10)""",
    """from course.models import load_hf_model
hf, tok = load_hf_model({folder!r})""",
    """import torch
from course.attention_analysis import attention_maps
from course.widgets import attention_explorer, cache_explorer
from tests.conftest import tiny_model
from tests.notebooks.test_widgets import WordTokenizer
torch.manual_seed(0)
model, ids = tiny_model("llama"), torch.randint(1, 97, (1, 40))
attention_explorer(attention_maps(model, ids), [f"t{{i}}" for i in range(40)])""",
    "cache_explorer(model, WordTokenizer(), ids)",
]


@pytest.fixture(scope="module")
def notebook(tmp_path_factory) -> Path:
    """The notebook, with a tiny Llama checkpoint (SmolLM2's tokenizer) for transformers to load."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from course import assets

    folder = tmp_path_factory.mktemp("tiny-llama")
    tok = AutoTokenizer.from_pretrained(str(assets.require("smollm2-135m")))
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    cells = [new_code_cell(src.format(folder=str(folder))) for src in CELLS]
    cells[0].metadata["tags"] = ["parameters"]
    path = tmp_path_factory.mktemp("nb") / "small.ipynb"
    nbformat.write(new_notebook(cells=cells, metadata={"kernelspec": KERNELSPEC}), str(path))
    return path


@pytest.fixture
def kernel_env(monkeypatch):
    """Kernels import this checkout's course and tests; no front end's marks; one thread."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for name in ("COURSE_PROGRESS", "JPY_SESSION_NAME", "VSCODE_PID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return monkeypatch


def run_nbclient(path: Path, out: Path) -> Path:
    nb = nbformat.read(str(path), as_version=4)
    NotebookClient(nb, timeout=120, resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, str(out))
    return out


def cell_index(path: Path, marker: str) -> int:
    """The index of the cell whose source holds ``marker`` (papermill inserts a cell of its own)."""
    nb = nbformat.read(str(path), as_version=4)
    (index,) = [i for i, c in enumerate(nb.cells) if marker in c.source]
    return index


def texts(path: Path, marker: str) -> str:
    """What a page without a kernel shows for the cell whose source holds ``marker``."""
    nb = nbformat.read(str(path), as_version=4)
    return "".join(t for o in nb.cells[cell_index(path, marker)].outputs for t in output_texts(o))


def test_executed_like_run_course_the_outputs_read_cleanly(notebook, kernel_env, tmp_path):
    out = tmp_path / "papermill.ipynb"
    execute_notebook(notebook, out, fast=True)  # what run-course.sh --execute and bench --notebooks do
    assert check_notebook(out) == []
    bars = texts(out, 'desc="loop"')
    assert "loop: 100%|" in bars and "by hand: 100%|" in bars and "\r" not in bars
    for marker, name in [("attention_explorer(attention_maps", "attention explorer"),
                         ("cache_explorer(model", "cache explorer")]:
        assert texts(out, marker).startswith(f"[{name}: interactive, it needs a live Jupyter kernel")


def test_executed_like_nbval_with_no_setting_the_outputs_read_cleanly(notebook, kernel_env, tmp_path):
    out = run_nbclient(notebook, tmp_path / "nbclient.ipynb")
    assert check_notebook(out) == []
    assert "loop: 100%|" in texts(out, 'desc="loop"')


def test_with_live_bars_the_checker_finds_the_frozen_bar_and_the_loading_message(notebook, kernel_env, tmp_path):
    kernel_env.setenv("COURSE_PROGRESS", "live")
    out = run_nbclient(notebook, tmp_path / "live.ipynb")
    problems = {(p.cell, p.problem) for p in check_notebook(out)}
    assert (cell_index(out, 'desc="loop"'), "progress bar stopped at 0 %") in problems
    assert (cell_index(out, "load_hf_model("), "model loading message") in problems
    explorers = {cell_index(out, "attention_explorer(attention_maps"), cell_index(out, "cache_explorer(model")}
    assert not {cell for cell, _ in problems} & explorers, "the explorers read as one line in every mode"
