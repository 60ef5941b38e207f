"""The few lines every notebook runs after its parameters cell."""

from __future__ import annotations

import os

import torch

__all__ = ["configure"]


def configure(fast: bool, model: str, seed: int = 0) -> tuple[bool, str]:
    """Resolve the run mode: FAST also from ``COURSE_FAST=1``; the model may be pinned by
    ``COURSE_MODEL`` (the test suite pins the offline one); seed torch. Returns (fast, model)."""
    fast = bool(fast) or os.environ.get("COURSE_FAST") == "1"
    model = os.environ.get("COURSE_MODEL") or model
    torch.manual_seed(seed)
    print(f"FAST={fast}  MODEL={model}  seed={seed}")
    return fast, model
