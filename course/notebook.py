"""The few lines every notebook runs after its parameters cell, and the checks of its parameters.

Papermill passes ``-p NAME value`` as a Python literal when it can parse one and ``-r NAME value``
always as a string, so a parameter may arrive as ``False`` or as ``"False"``. Each is checked
here: booleans accept True/False (or those words as strings), anything else stops the notebook
with one line naming the parameter, the value and what is allowed.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

import torch

from course.model_names import DEVICE_PATTERN, SEED_MAX
from course.splits import split_seed

__all__ = ["configure", "configure_parameters", "Parameters", "as_bool", "as_fast", "as_model", "as_seed", "as_device"]

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


class Parameters(NamedTuple):
    """The checked parameters of a notebook."""

    fast: bool
    model: str | None
    device: str
    autofill: bool
    seed: int


def as_bool(name: str, value: object) -> bool:
    """``value`` as a bool: True/False, or (from ``papermill -r``) one of true/false/1/0/yes/no/on/off."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def as_fast(name: str, value: object, device: str) -> bool:
    """FAST as a bool. ``"auto"``: the small sizes on a CPU (every notebook within minutes on a laptop) and the
    full sizes on a GPU, decided by the device the notebook will use; otherwise ``as_bool``."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        from course.models import resolve_device

        return resolve_device(device).type == "cpu"
    try:
        return as_bool(name, value)
    except ValueError:
        raise ValueError(f"{name} must be True, False or \"auto\", got {value!r} ({type(value).__name__})") from None


def as_model(name: str, value: object) -> str:
    """``value`` as a model name (``course.model_names``: a course model or a Hugging Face checkpoint)."""
    from course.model_names import check_model_name

    try:
        return check_model_name(value)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def as_seed(name: str, value: object) -> int:
    """``value`` as a seed: an integer (or its decimal string) from 0 to 2**32 - 1."""
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise ValueError(f"{name} must be an integer from 0 to {SEED_MAX}, got {value!r}")
    return value


def as_device(name: str, value: object) -> str:
    """``value`` as a device name: auto, cpu, cuda, cuda:N or mps."""
    if isinstance(value, str) and re.fullmatch(DEVICE_PATTERN, value):
        return value
    raise ValueError(f"{name} must be auto, cpu, cuda, cuda:N or mps, got {value!r}")


def configure_parameters(fast: object, model: object, seed: object = 0, device: object = "auto",
                         autofill: object = False) -> Parameters:
    """Check every parameter of a notebook, resolve the run mode and seed torch.

    FAST may be True, False or ``"auto"`` (``as_fast``: small sizes on a CPU, full sizes on a GPU);
    ``COURSE_FAST=1`` forces the small sizes and ``COURSE_FAST=0`` the full ones. The model may be pinned by ``COURSE_MODEL``
    (the test suite pins the offline one); ``model=None``: the notebook trains its own models. Picks torch's
    thread count for the cores that are free (``course.threads.use_threads``) and the figures' style
    (``course.plots.use_course_style``). Returns
    ``Parameters(fast, model, device, autofill, seed)``; a notebook unpacks it as
    ``FAST, MODEL, DEVICE, AUTOFILL, SEED = configure_parameters(FAST, MODEL, SEED, DEVICE, AUTOFILL)``."""
    from course.plots import use_course_style
    from course.threads import use_threads

    if model is None:
        chosen = None
    elif os.environ.get("COURSE_MODEL"):
        chosen = as_model("COURSE_MODEL", os.environ["COURSE_MODEL"])
    else:
        chosen = as_model("MODEL", model)
    device = as_device("DEVICE", device)
    forced = os.environ.get("COURSE_FAST")
    if forced not in (None, "", "0", "1"):
        raise ValueError(f"COURSE_FAST must be 1 (small sizes) or 0 (full sizes), got {forced!r}")
    params = Parameters(
        fast=as_fast("FAST", fast, device) if forced in (None, "") else forced == "1",
        model=chosen,
        device=device,
        autofill=as_bool("AUTOFILL", autofill),
        seed=as_seed("SEED", seed),
    )
    torch.manual_seed(split_seed(params.seed))  # the split's stream (course.splits): exploration never shares it
    use_threads()
    use_course_style()
    print(f"FAST={params.fast}{' (auto)' if str(fast).strip().lower() == 'auto' else ''}  "
          f"MODEL={params.model or '(trained here)'}  seed={params.seed}")
    return params


def configure(fast: object, model: object, seed: object = 0) -> tuple[bool, str | None]:
    """Check FAST, MODEL and SEED, resolve the run mode and seed torch. Returns (fast, model).

    The notebooks' call ``FAST, MODEL = configure(FAST, MODEL, SEED)``; ``configure_parameters``
    also checks DEVICE and AUTOFILL."""
    params = configure_parameters(fast, model, seed)
    return params.fast, params.model
