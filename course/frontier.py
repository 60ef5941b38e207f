"""Quality against bytes: every way of shrinking the cache measured on the same passages (notebook 08).

A *store* is a policy (which tokens stay) with an optional quantizer (how they are kept). Each store streams the same
passages ([B, T] ids, one per row) token by token, exactly (``exact_stream`` for policies decided by positions,
the decode loop for the others); its quality is each passage's perplexity over the predictions from ``start`` on,
and its size the bytes its cache holds at the end of the stream, counted at 16 bits per full-precision number (what a
GPU deployment stores, whatever dtype the course computes in), as a fraction of the full cache's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from course.models.base import CausalLM
from course.passages import Spread, spread
from course.policies import Policy
from course.progress import progress_bar
from course.streaming import decode_stream, exact_stream

__all__ = ["StorePoint", "measure_store", "frontier", "held_fraction", "DEPLOYED_BYTES"]

DEPLOYED_BYTES = 2  # bytes of one full-precision number in the bytes a store is charged (16-bit)


def held_fraction(model: CausalLM, cache, tokens: int) -> float:
    """The bytes ``cache`` holds, counted as a store at 16 bits holds them (``bytes_at(DEPLOYED_BYTES)``), as a
    fraction of a full cache of ``tokens`` tokens in each of its batch rows."""
    full = model.config.cache_bytes_per_token(DEPLOYED_BYTES) * tokens * cache.shape[1]
    return cache.bytes_at(DEPLOYED_BYTES) / full


@dataclass(frozen=True)
class StorePoint:
    """One store on the quality-bytes plane: its family (a line of the plot), label, the fraction of the full cache's
    bytes it holds at the end of the stream, and the perplexity of each passage."""

    family: str
    label: str
    bytes_fraction: float
    ppl: tuple[float, ...]

    @property
    def median(self) -> float:
        return spread(self.ppl).median

    def ratio_to(self, other: StorePoint) -> Spread:
        """Per-passage perplexity ratio self / other (paired: the same passages)."""
        return spread([a / b for a, b in zip(self.ppl, other.ppl)])


@torch.inference_mode()
def measure_store(model: CausalLM, ids: Tensor, policy: Policy, start: int, family: str = "",
                  label: str | None = None) -> StorePoint:
    """Stream ``ids`` [B, T] through ``policy``'s store: perplexity per passage over predictions start..T-2 and the
    store's bytes at the end as a fraction of the full cache's (T - 1 tokens fed, both at 16 bits)."""
    if not 0 <= start < ids.shape[1] - 1:
        raise ValueError(f"start must be between 0 and {ids.shape[1] - 2} (the stream's predictions), got {start}")
    run = exact_stream if policy.is_static else decode_stream
    result = run(model, ids, policy, progress=False,
                 inspect=lambda cache: {"fraction": held_fraction(model, cache, ids.shape[1] - 1)})
    return StorePoint(family, label or repr(policy), result.extra["fraction"], tuple(result.ppl_per_stream(start)))


def frontier(model: CausalLM, ids: Tensor, stores: Mapping[tuple[str, str], Callable[[], Policy]], start: int,
             progress: bool = True) -> list[StorePoint]:
    """``measure_store`` for every (family, label) -> policy factory, in order."""
    return [measure_store(model, ids, make(), start, family, label)
            for (family, label), make in progress_bar(stores.items(), desc="stores", enabled=progress)]
