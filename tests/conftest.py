"""Shared fixtures: tiny random models of both families (offline) and the real SmolLM2."""

from __future__ import annotations

import pytest
import torch

from course import assets
from course.models import build_model, from_transformers
from course.models.base import ModelConfig


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
def austen_ids(smollm2):
    from course.data import load_text, tokenize

    return tokenize(smollm2[1], load_text("austen", "pride_and_prejudice"), 1024)
