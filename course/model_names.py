"""The names ``load_model`` accepts (kept free of torch, so that the command line can check them at once)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["MODEL_NAMES", "check_model_name"]

MODEL_NAMES = ("auto", "gpt2", "smollm2-135m", "gpt2-random")  # plus any supported Hugging Face checkpoint


def check_model_name(name: object) -> str:
    """``name`` if it is a course model name or a Hugging Face checkpoint (``org/name`` or a local folder)."""
    if isinstance(name, str) and (name in MODEL_NAMES or Path(name).is_dir()
                                  or (name.count("/") == 1 and all(name.split("/")))):
        return name
    raise ValueError(f"model must be one of {', '.join(MODEL_NAMES)}, or a Hugging Face checkpoint "
                     f"(org/name, or a local folder); got {name!r}")
