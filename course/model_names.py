"""The names and values the course accepts from users: models, devices, seeds (kept free of torch, so that
the command line and the notebooks' parameters check them with one rule each, at once)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["MODEL_NAMES", "check_model_name", "SEED_MAX", "DEVICE_PATTERN", "VARIANTS"]

SEED_MAX = 2**32 - 1  # seeds: what every generator (torch, numpy, random) accepts
DEVICE_PATTERN = r"auto|cpu|cuda(:\d+)?|mps"  # a device name (whether it exists is checked when it is used)
# plus any supported Hugging Face checkpoint; gpt2-tiny-random: GPT-2's code at 4 layers, width 128 (tests)
MODEL_NAMES = ("auto", "gpt2", "smollm2-135m", "gpt2-random", "gpt2-tiny-random")
VARIANTS = ("vanilla", "sink-token", "sink-logit", "off-by-one", "gated")  # notebook 06's models (course.train)


def check_model_name(name: object) -> str:
    """``name`` if it is a course model name or a Hugging Face checkpoint (``org/name`` or a local folder)."""
    if isinstance(name, str) and (name in MODEL_NAMES or Path(name).is_dir()
                                  or (name.count("/") == 1 and all(name.split("/")))):
        return name
    raise ValueError(f"model must be one of {', '.join(MODEL_NAMES)}, or a Hugging Face checkpoint "
                     f"(org/name, or a local folder); got {name!r}")
