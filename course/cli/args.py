"""What the commands share: the ``Command`` record, argparse types that name the allowed range, and the
model, device and cache-policy arguments."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass

from course.model_names import DEVICE_PATTERN, SEED_MAX


@dataclass
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], dict | None]

    def add_parser(self, sub) -> None:
        p = sub.add_parser(self.name, help=self.help, description=self.help)
        self.configure(p)
        p.set_defaults(run=self.run)


def bounded_int(text: str, low: int, high: int | None = None) -> int:
    """argparse type: an integer from ``low`` to ``high`` (no upper bound when None); the error names the range."""
    allowed = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}") from None
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {text}")
    return value


def model_name(text: str) -> str:
    """A course model name, or a Hugging Face checkpoint: ``org/name`` on the hub or a local folder."""
    from course.model_names import check_model_name

    try:
        return check_model_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return bounded_int(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return bounded_int(text, 0)


def seed_int(text: str) -> int:
    """argparse type: a seed, 0 .. 2**32 - 1."""
    return bounded_int(text, 0, SEED_MAX)


def unit_float(text: str) -> float:
    """argparse type: a number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {text!r}")
    return value


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", type=model_name,
                   help="auto, gpt2, smollm2-135m (default), gpt2-random, gpt2-tiny-random, or a Hugging Face "
                        "checkpoint")
    p.add_argument("--device", default="auto", type=device_name, help="cpu, cuda, cuda:N, mps or auto")


def _policy_args(p: argparse.ArgumentParser, policies: tuple[str, ...], default: str, budget: int | list[int]) -> None:
    """The one vocabulary for a cache policy: --policy (one of ``policies``, names of the table of policies),
    --budget (slots per KV head, sinks included), --sinks."""
    p.add_argument("--policy", default=default, choices=policies)
    many = isinstance(budget, list)
    p.add_argument("--budget", type=positive_int, default=budget, nargs="+" if many else None,
                   help="cache slots per KV head, pinned sinks included" + (" (several: a sweep)" if many else "")
                        + f" (default {budget}; ignored by full)")
    p.add_argument("--sinks", type=non_negative_int, default=None,
                   help="first tokens pinned in the cache (default: 4 for streaming, else 0)")
    p.add_argument("--positions", choices=["original", "cache"], default=None,
                   help="position rule (default: what the model allows; cache for streaming on RoPE models)")


def _policy_for(args: argparse.Namespace, budget: int, model=None):
    """The policy the arguments ask for (``make_policy``); call it without a model to refuse bad values
    before the model loads, then with the model for its position rule."""
    from course.policies import POLICIES, make_policy

    return make_policy(args.policy, budget if POLICIES[args.policy].bounded else None, sinks=args.sinks,
                       positions=args.positions, model=model)


def device_name(text: str) -> str:
    """argparse type: auto, cpu, cuda, cuda:N or mps (whether it exists is checked when it is used)."""
    if not re.fullmatch(DEVICE_PATTERN, text):
        raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda, cuda:N or mps, got {text!r}")
    return text


def check_out_folder(path: str, label: str = "--out") -> None:
    """Before long work: the output folder can be created and written (else a one-line ``ValueError``)."""
    from pathlib import Path

    from course.assets import probe_write

    if not path.strip():
        raise ValueError(f"{label} must name a folder, got {path!r}")
    try:
        probe_write(Path(path))
    except OSError as e:
        raise ValueError(f"{label} {path!r} is not a writable folder ({e.strerror or e})") from None


def jobs_count(text: str) -> int:
    """argparse type: how many submissions to grade at once, 1 to the cores this process may use."""
    from course.threads import cpu_cores

    cores = cpu_cores()
    try:
        return bounded_int(text, 1, cores)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to {cores} (the cores available here), "
                                         f"got {text!r}") from None
