"""How the kept tokens are stored: the protocol every store follows, and the table of stores.

A policy decides *which* slots survive (``course.policies``); a store decides *how* their numbers are held. The cache
(``course.kvcache``) owns one store and calls it at fixed points, whatever the policy:

* ``check_head_dim(head_dim)`` when the cache is made (a store that groups channels refuses a head it cannot split);
* ``settle(keys, values, positions, stat, done, next_position, rotated=...)`` before new tokens arrive, when the store
  ``rounds`` (changes numbers as tokens age): it rewrites one layer's slots in place and says how far it got;
* ``check_chunk`` / ``chunk_starts``: where the exact evaluator may cut a stream into chunks;
* ``nbytes(layer, dtype_bytes)``: the bytes a real store of this kind holds for one layer's slots in use.

``slot_stat``: the name of the per-slot number the store keeps in ``LayerCache.stats`` (moved with its slot by every
eviction), or None. ``Storage`` itself is full precision in every respect: a new store overrides what it changes.

A store is declared once: one file with its class, and one ``register_storage`` call (docs/add-a-policy.md).
``make_storage(name, **options)`` builds one by name; ``storage_names()`` lists them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from course.slots import LayerCache

__all__ = ["Storage", "STORAGES", "register_storage", "make_storage", "storage_names"]


class Storage:
    """The protocol of a store, with full precision's answers as defaults (see the module docstring)."""

    name = "storage"
    rounds = False  # True: the cache calls ``settle`` before new tokens arrive (and cannot rewind)
    slot_stat: str | None = None  # the per-slot statistic the store keeps in ``LayerCache.stats``

    @property
    def label(self) -> str:
        """A short name for tables and plots ('' for full precision: nothing to say)."""
        return self.name

    def check_head_dim(self, head_dim: int) -> None:
        """Refuse a head dimension the store cannot hold (ValueError naming the parameter)."""

    def chunk_starts(self, n_tokens: int) -> list[int]:
        """Positions below ``n_tokens`` where the exact evaluator must start a new chunk (none: any cut is exact)."""
        return []

    def check_chunk(self, first: int, tokens: int) -> None:
        """Refuse a stream chunk at positions first .. first + tokens - 1 that the store cannot run exactly."""

    def settle(self, keys: Tensor, values: Tensor, positions: Tensor, stat: Tensor | None, done: int,
               next_position: int, *, rotated: bool = False) -> int:
        """Rewrite, in place, the numbers of one layer's slots that must change before a token at ``next_position``
        arrives (keys, values [B, H_kv, S, d], positions [B, H_kv, S], ``stat`` the ``slot_stat`` [B, H_kv, S]);
        ``done``: how far the store got at the previous call (a position). ``rotated``: the keys are rotated at their
        original positions (a cache of rotated keys), not before rotation. Returns the new ``done``."""
        return done

    def nbytes(self, layer: LayerCache, dtype_bytes: int) -> int:
        """Bytes of one layer's keys and values in use with ``dtype_bytes`` per full-precision number: 2 (K and V)
        x batch x kv_heads x slots x head_dim x bytes."""
        b, h, s, d = layer.live()[0].shape
        return 2 * b * h * s * d * dtype_bytes


STORAGES: dict[str, type[Storage]] = {}


def register_storage(cls: type[Storage]) -> type[Storage]:
    """Add a store (a ``Storage`` subclass, under its ``name``) to the table; a name may be registered once.
    Returns the class (usable as a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Storage)):
        raise TypeError(f"register_storage takes a Storage subclass, got {cls!r}")
    if not cls.name or cls.name in STORAGES:
        raise ValueError(f"a store needs a name not registered yet, got {cls.name!r}")
    STORAGES[cls.name] = cls
    return cls


def make_storage(name: str, **options) -> Storage:
    """The store ``name`` built with ``options`` (e.g. ``make_storage("kivi", bits=2)``)."""
    if name not in STORAGES:
        raise ValueError(f"storage must be one of {', '.join(STORAGES)}; got {name!r}")
    return STORAGES[name](**options)


def storage_names() -> tuple[str, ...]:
    """The registered stores, in the order registered."""
    return tuple(STORAGES)
