"""Checksums of the files in a cache folder, and the checks that use them.

Every folder the course derives (the converted model, the novels) holds a manifest,
``COMPLETE.json``, that records for each file its size, its SHA-256 and the modification time
it had when it was written:

    {"files": {"model.safetensors": {"size": 538090408, "sha256": "...", "mtime_ns": ...}}, ...}

Two levels of checking:

* ``quick`` (every load): the size must match; when the modification time also matches the file
  is taken as written, otherwise its SHA-256 is computed and compared (a copied cache pays this
  once per process);
* ``full`` (``python -m course info --verify`` and ``fetch``): the SHA-256 of every file.

A manifest written by an older version of the course (sizes only, no checksums) cannot vouch for
its files: such a folder is reported as unverified, and ``fetch`` derives it again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MANIFEST", "Problem", "sha256_of", "write_manifest", "check_folder", "write_atomic"]

MANIFEST = "COMPLETE.json"

_verified: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256 hashed in this process


@dataclass(frozen=True)
class Problem:
    """What is wrong with one file of a cache folder (``path`` may be the folder itself)."""

    path: Path
    what: str

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


def sha256_of(path: Path) -> str:
    """SHA-256 (hex) of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _record(path: Path) -> dict:
    st = path.stat()
    digest = sha256_of(path)
    _verified[(str(path), st.st_size, st.st_mtime_ns)] = digest
    return {"size": st.st_size, "sha256": digest, "mtime_ns": st.st_mtime_ns}


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed into place (never half-written)."""
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_manifest(folder: Path, **info: object) -> None:
    """Record size, SHA-256 and modification time of every file in ``folder`` (plus ``info``)."""
    files = {p.name: _record(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    write_atomic(folder / MANIFEST, json.dumps({"files": files, **info}, indent=1).encode())


def _read_manifest(folder: Path) -> tuple[dict | None, Problem | None]:
    manifest = folder / MANIFEST
    if not folder.is_dir():
        return None, Problem(folder, "missing")
    try:
        files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
        if not isinstance(files, dict):
            raise TypeError
    except FileNotFoundError:
        return None, Problem(manifest, "missing (the folder was never completed)")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, Problem(manifest, f"unreadable manifest ({type(e).__name__})")
    if not all(isinstance(r, dict) and {"size", "sha256", "mtime_ns"} <= r.keys() for r in files.values()):
        return None, Problem(manifest, "no checksums recorded (written by an older version of the course)")
    return files, None


def _check_file(path: Path, record: dict, full: bool) -> Problem | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return Problem(path, "missing")
    except OSError as e:
        return Problem(path, f"cannot be read ({e.strerror})")
    if st.st_size != record["size"]:
        return Problem(path, f"size {st.st_size} bytes, expected {record['size']} (truncated or replaced)")
    if not full and st.st_mtime_ns == record["mtime_ns"]:
        return None
    key = (str(path), st.st_size, st.st_mtime_ns)
    if full or key not in _verified:
        try:
            _verified[key] = sha256_of(path)
        except OSError as e:
            return Problem(path, f"cannot be read ({e.strerror})")
    if _verified[key] != record["sha256"]:
        return Problem(path, "content differs from the recorded SHA-256 (damaged or modified)")
    return None


def check_folder(folder: Path, full: bool = False) -> list[Problem]:
    """Problems of a derived folder ([] when every recorded file is intact).

    ``full=False``: size, then SHA-256 only for files whose modification time changed;
    ``full=True``: SHA-256 of every file."""
    files, problem = _read_manifest(folder)
    if problem is not None:
        return [problem]
    assert files is not None
    return [p for name, record in files.items() if (p := _check_file(folder / name, record, full)) is not None]
