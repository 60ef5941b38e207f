"""Small deterministic inputs the checkers share."""

from __future__ import annotations

import torch

from course.models import build_model
from course.models.base import CausalLM, ModelConfig


def tiny_model(family: str = "llama", seed: int = 0, n_layer: int = 2) -> CausalLM:
    """A small random model in float64 (fast, and exact enough to compare to 1e-9)."""
    cfg = ModelConfig(family=family, vocab_size=53, n_layer=n_layer, n_head=4, n_kv_head=2 if family == "llama" else 4,
                      d_model=32, head_dim=8, d_ff=48, max_positions=512, name=f"tiny-{family}")
    torch.manual_seed(seed)
    model = build_model(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


def close(a, b, tol: float = 1e-6) -> bool:
    """Same shape and values within ``tol`` (never raises)."""
    try:
        a, b = torch.as_tensor(a), torch.as_tensor(b)
        return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), atol=tol, rtol=tol))
    except (TypeError, RuntimeError, ValueError):
        return False


class CallCounter:
    """Wraps a model and records the number of new tokens of every forward call."""

    def __init__(self, model: CausalLM) -> None:
        self.model, self.calls = model, []

    def __call__(self, ids, *args, **kwargs):
        self.calls.append(ids.shape[-1])
        return self.model(ids, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)
