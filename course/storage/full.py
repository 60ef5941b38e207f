"""Full precision: every kept number as the model computed it (the ``Storage`` protocol's own answers)."""

from __future__ import annotations

from dataclasses import dataclass

from course.storage.base import Storage, register_storage

__all__ = ["FullPrecision"]


@register_storage
@dataclass(frozen=True)
class FullPrecision(Storage):
    """Keep every number at the cache's dtype: nothing is rounded, ``nbytes`` is ``cache_bytes_per_token`` per slot."""

    name = "full"

    @property
    def label(self) -> str:
        return ""
