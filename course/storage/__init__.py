"""How the kept tokens are stored: the ``Storage`` protocol, its table, and the stores (one file each).

``full`` (``FullPrecision``): every number at the cache's dtype. ``kivi`` (``KIVI``, and ``RoundingFunction``, its
rounding done by a function): KIVI's per-channel keys and per-token values. ``kivi-post-rope`` (``KIVIPostRoPE``):
the same with keys rounded after the rotary embedding. A new store: one file and one ``register_storage``, imported
below (docs/add-a-policy.md).
"""

from course.storage.base import STORAGES, Storage, make_storage, register_storage, storage_names
from course.storage.full import FullPrecision
from course.storage.kivi import BITS, GROUP_STAT, KIVI, RoundingFunction
from course.storage.kivi_post_rope import KIVIPostRoPE

__all__ = ["Storage", "STORAGES", "register_storage", "make_storage", "storage_names", "FullPrecision", "KIVI",
           "RoundingFunction", "KIVIPostRoPE", "GROUP_STAT", "BITS"]
