"""Texts for the experiments: the Austen novels offline, any local file, PG-19/wikitext online."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import Tensor

from course.assets import AUSTEN_BOOKS, require
from course.splits import check_split, record_text, split_range

__all__ = ["load_text", "load_split_text", "tokenize", "tokenize_file", "tokenize_pieces", "read_text_file",
           "check_text_file", "CORPORA"]

CORPORA = ("austen", "pg19", "wikitext")


def load_text(source: str | Path, book: str | None = None) -> str:
    """Return a text.

    * ``load_text("austen")``: all six novels, in publication order;
      ``load_text("austen", "pride_and_prejudice")``: one of them (see ``AUSTEN_BOOKS``);
    * ``load_text(path)``: any local UTF-8 text file;
    * ``load_text("pg19")`` / ``load_text("wikitext")``: one test document through the
      ``datasets`` package (online machines only; ``book`` picks the index, default 0).
    """
    if isinstance(source, str) and not source.strip():
        raise ValueError("source must be 'austen', 'pg19', 'wikitext' or the path of a text file, got ''")
    if isinstance(source, Path) or (isinstance(source, str) and source not in CORPORA and Path(source).exists()):
        return "".join(read_text_file(source))
    if not isinstance(source, str):
        raise TypeError(f"source must be a corpus name or a path, got {type(source).__name__}")
    if source == "austen":
        folder = require("austen")
        names = list(AUSTEN_BOOKS.values())
        if book is None:
            return "\n\n".join("".join(read_text_file(folder / f"{n}.txt")) for n in names)
        if book not in names:
            raise ValueError(f"book must be one of {', '.join(names)}; got {book!r}")
        return "".join(read_text_file(folder / f"{book}.txt"))
    if source in ("pg19", "wikitext"):
        return _load_online(source, int(book or 0))
    raise ValueError(
        f"unknown text source {source!r}: give 'austen', 'pg19', 'wikitext' or the path of an existing text file"
    )


def load_split_text(book: str, split: str | None = None, record: bool = True) -> tuple[str, int]:
    """The characters of Austen's ``book`` that ``split`` may read (``course.splits.split_range``: confirmation the
    opening and most of the novel, exploration its last fifth) and the offset of the first of them in the novel.
    ``record``: write the whole range down as drawn (``course.splits.DRAWN``)."""
    split = check_split(split)
    text = load_text("austen", book)
    start, end = split_range(len(text), split)
    if record:
        record_text(f"austen/{book}", start, end, split)
    return text[start:end], start


def check_text_file(path: str | Path, label: str = "text file") -> Path:
    """The path of a readable, non-empty UTF-8 text file, or a one-line ``ValueError`` naming
    ``label`` and the path (checked on its first block only: cheap, before any model loads)."""
    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise ValueError(f"{label} must be the path of a UTF-8 text file, got {path!r}")
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{label} {str(p)!r} does not exist")
    if p.is_dir():
        raise ValueError(f"{label} {str(p)!r} is a directory, not a text file")
    any(piece.strip() for piece in read_text_file(p, label=label))  # stops at the first text; raises if none
    return p


def read_text_file(path: str | Path, first_block: int = 1 << 16, label: str = "text file") -> Iterator[str]:
    """Decode a UTF-8 file lazily, in blocks that double in size from ``first_block`` bytes.

    Raises a one-line ``ValueError`` naming ``label``, the path and the byte offset for a file
    that is not text (invalid UTF-8, UTF-16, NUL bytes), empty, or cannot be read. A UTF-8
    byte-order mark is dropped."""
    p = Path(path)
    decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="strict")
    offset, size, produced = 0, first_block, False
    try:
        with open(p, "rb") as f:
            while True:
                raw = f.read(size)
                pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous block
                try:
                    text = decoder.decode(raw, final=not raw)
                except UnicodeDecodeError as e:
                    hint = "; it looks like UTF-16: re-save it as UTF-8" if offset == 0 and raw[:2] in (
                        b"\xff\xfe", b"\xfe\xff") else ""
                    raise ValueError(f"{label} {str(p)!r} is not UTF-8 text: {e.reason} at byte "
                                     f"{offset - pending + e.start}{hint}") from None
                if "\x00" in text:
                    at = offset + len(raw[: raw.find(b"\x00")]) if b"\x00" in raw else offset
                    raise ValueError(f"{label} {str(p)!r} contains NUL bytes (at byte {at}): a binary file, not text")
                if text:
                    produced = produced or bool(text.strip())
                    yield text
                if not raw:
                    break
                offset += len(raw)
                size *= 2
    except IsADirectoryError:
        raise ValueError(f"{label} {str(p)!r} is a directory, not a text file") from None
    except OSError as e:
        raise ValueError(f"{label} {str(p)!r} cannot be read: {e.strerror or e}") from None
    if not produced:
        raise ValueError(f"{label} {str(p)!r} is empty")


def _load_online(name: str, index: int) -> str:
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - optional
        raise RuntimeError(f"load_text({name!r}) needs `pip install datasets` and a network connection") from e
    if name == "pg19":
        ds = datasets.load_dataset("emozilla/pg19-test", split="test")
        return ds[index]["text"]
    ds = datasets.load_dataset("Salesforce/wikitext", "wikitext-103-raw-v1", split="test")
    return "".join(ds["text"])


MARGIN = 16  # extra tokens beyond n_tokens before a prefix's tokens are trusted (BPE merges at its end)


def _check_n_tokens(n_tokens: int | None) -> None:
    if n_tokens is not None and (isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1):
        raise ValueError(f"n_tokens must be an integer >= 1 (or None for all), got {n_tokens!r}")


def _encode(tokenizer, text: str) -> Tensor:
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids


def tokenize_pieces(tokenizer, pieces: Iterable[str], n_tokens: int | None = None,
                    device: torch.device | str = "cpu") -> Tensor:
    """Token ids [1, T] of the text made of ``pieces``, reading only as many pieces as the first
    ``n_tokens`` need (plus a small margin). With pieces that grow geometrically the work is
    proportional to the tokens asked for, not to the length of the text."""
    _check_n_tokens(n_tokens)
    text, ids = "", None
    for piece in pieces:
        text += piece
        if n_tokens is None:
            continue
        ids = _encode(tokenizer, text)
        if ids.shape[1] > n_tokens + MARGIN:
            return ids[:, :n_tokens].to(device)
    if not text.strip():
        raise ValueError("text is empty: nothing to tokenize")
    if ids is None or n_tokens is None:
        ids = _encode(tokenizer, text)
    if n_tokens is not None:
        if ids.shape[1] < n_tokens:
            raise ValueError(f"the text has only {ids.shape[1]} tokens, fewer than n_tokens={n_tokens}")
        ids = ids[:, :n_tokens]
    return ids.to(device)


def _string_pieces(text: str, first: int) -> Iterator[str]:
    start, size = 0, first
    while start < len(text):
        yield text[start : start + size]
        start, size = start + size, 2 * size


def tokenize(tokenizer, text: str, n_tokens: int | None = None, device: torch.device | str = "cpu") -> Tensor:
    """Token ids of ``text`` as [1, T] (the first ``n_tokens`` if given), with a clear error if too short.

    Only a prefix of a long text is tokenised when ``n_tokens`` is given."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    _check_n_tokens(n_tokens)
    first = len(text) if n_tokens is None else max(4096, 8 * n_tokens)
    return tokenize_pieces(tokenizer, _string_pieces(text, first), n_tokens, device)


def tokenize_file(tokenizer, path: str | Path, n_tokens: int | None = None, device: torch.device | str = "cpu",
                  label: str = "text file") -> Tensor:
    """Token ids [1, T] of the first ``n_tokens`` of a UTF-8 file, read lazily: a 50 MB file costs
    what its first blocks cost. Errors name ``label`` and the path."""
    _check_n_tokens(n_tokens)
    check_text_file(path, label)
    first = 1 << 16 if n_tokens is None else max(4096, 8 * n_tokens)
    return tokenize_pieces(tokenizer, read_text_file(path, first, label), n_tokens, device)
