"""Shared fixtures: tiny random models of both families (offline), the real SmolLM2, and a graded release."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from course import assets
from course.models import build_model, from_transformers
from course.models.base import ModelConfig
from course.threads import THREADS_ENV, share_of_cores


def _share_the_cores_between_workers() -> None:
    """Under pytest-xdist (``-n N``), each worker takes its share of the cores (at least one thread): N workers at
    every core's worth of torch threads would wait for each other at every operation. The processes a test starts
    (kernels, command-line runs) inherit the share through ``OMP_NUM_THREADS`` and ``COURSE_THREADS``."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = str(share_of_cores(workers))
        os.environ["OMP_NUM_THREADS"] = share
        os.environ.setdefault(THREADS_ENV, share)
        torch.set_num_threads(int(share))


_share_the_cores_between_workers()


def tiny_config(family: str, **kw) -> ModelConfig:
    base = dict(family=family, vocab_size=97, n_layer=2, n_head=4, n_kv_head=4 if family == "gpt2" else 2,
                d_model=32, head_dim=8, d_ff=64, max_positions=256, rope_theta=10000.0, name=f"tiny-{family}")
    base.update(kw)
    return ModelConfig(**base)


def tiny_model(family: str, seed: int = 0, dtype=torch.float64, **kw):
    torch.manual_seed(seed)
    model = build_model(tiny_config(family, **kw)).to(dtype).eval()
    with torch.no_grad():  # larger weights than the default init, so attention is far from uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


def float64_reference(hf):
    """Make a float64 transformers Llama-family model compute in float64 throughout.

    transformers keeps two steps in float32 whatever the model's dtype: RoPE's angles (``inv_freq`` is built in
    float32 and ``LlamaRotaryEmbedding.forward`` casts positions with ``.float()``) and RMSNorm (``.to(float32)``).
    A model cast to float64 then rounds to float32 there, and its logits differ from exact ones by ~1e-7 (small
    random models) to ~3e-5 (SmolLM2 at 256 positions): float32 round-off that no float64 comparison should
    have to allow. The course's ``rope`` and ``RMSNorm`` compute at (at least) the input's dtype. Returns ``hf``."""
    import types

    def rope_forward(self, x, position_ids):
        freqs = position_ids[..., None].double() * self.inv_freq64.to(x.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)

    def norm_forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    for module in hf.modules():
        name = type(module).__name__
        if name.endswith("RotaryEmbedding"):
            theta = module.config.rope_parameters["rope_theta"]
            d = getattr(module.config, "head_dim", None) or module.config.hidden_size // module.config.num_attention_heads
            module.inv_freq64 = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
            module.forward = types.MethodType(rope_forward, module)
        elif name.endswith("RMSNorm"):
            module.forward = types.MethodType(norm_forward, module)
    return hf


@pytest.fixture(params=["gpt2", "llama"])
def family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def smollm2():
    """(course model, tokenizer, transformers model) for SmolLM2-135M from the course cache."""
    if not assets.status()["smollm2-135m"]:
        pytest.fail("SmolLM2-135M is not in the course cache: run `python -m course fetch` first")
    from course.models import load_hf_model

    hf, tok = load_hf_model("smollm2-135m")
    return from_transformers(hf, "smollm2-135m"), tok, hf


@pytest.fixture(scope="session")
def smollm2_f64(smollm2):
    """(course model, transformers model) for SmolLM2-135M in float64: sameness tests compare in float64, where
    round-off (~1e-12) cannot decide them as it can in float32 (see tests/models/test_models.py)."""
    import copy

    hf64 = float64_reference(copy.deepcopy(smollm2[2]).double())
    hf64.config._attn_implementation = "sdpa"  # eager attention takes its softmax in float32 whatever the dtype
    return from_transformers(hf64, "smollm2-135m"), hf64


@pytest.fixture(scope="session")
def austen_ids(smollm2):
    from course.data import load_text, tokenize

    return tokenize(smollm2[1], load_text("austen", "pride_and_prejudice"), 1024)


@pytest.fixture(scope="session")
def graded_release(tmp_path_factory) -> tuple[Path, Path]:
    """(folder of student copies, grading key): a release for graded use of every solution notebook, answers
    hidden, its questions' variants and its capstone passages drawn from seed 0."""
    from course.instructor.release import release

    folder = tmp_path_factory.mktemp("graded-release")
    notebooks = Path(__file__).resolve().parents[1] / "notebooks"
    release(notebooks, folder / "student", hidden_answers=True, key_path=folder / "key.json", seed=0)
    return folder / "student", folder / "key.json"


@pytest.fixture(scope="session")
def grading_key(tmp_path_factory) -> Path:
    """A grading key for the notebooks' own questions (no variants drawn), so that the solution notebooks
    themselves get full marks with it; its capstone passages are ``graded_release``'s (seed 0)."""
    from course.instructor.release import release

    folder = tmp_path_factory.mktemp("public-questions-release")
    notebooks = Path(__file__).resolve().parents[1] / "notebooks"
    release(notebooks, folder / "student", hidden_answers=True, key_path=folder / "key.json", seed=0, variants=False)
    return folder / "key.json"


@pytest.fixture
def short_tmpdir() -> Iterator[Path]:
    """An empty folder under /tmp with a short path, for a grader's TMPDIR: its kernels' folders (and sockets) are
    made inside it, where a test can find what they left (under a long TMPDIR the grader moves them to /tmp)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="t-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
