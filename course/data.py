"""Texts for the experiments: the Austen novels offline, any local file, PG-19/wikitext online."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from course.assets import AUSTEN_BOOKS, require

__all__ = ["load_text", "tokenize", "CORPORA"]

CORPORA = ("austen", "pg19", "wikitext")


def load_text(source: str | Path, book: str | None = None) -> str:
    """Return a text.

    * ``load_text("austen")``: all six novels, in publication order;
      ``load_text("austen", "pride_and_prejudice")``: one of them (see ``AUSTEN_BOOKS``);
    * ``load_text(path)``: any local UTF-8 text file;
    * ``load_text("pg19")`` / ``load_text("wikitext")``: one test document through the
      ``datasets`` package (online machines only; ``book`` picks the index, default 0).
    """
    if isinstance(source, Path) or (isinstance(source, str) and source not in CORPORA and Path(source).exists()):
        text = Path(source).read_text(encoding="utf-8")
        if not text.strip():
            raise ValueError(f"text file {source} is empty")
        return text
    if source == "austen":
        folder = require("austen")
        names = list(AUSTEN_BOOKS.values())
        if book is None:
            return "\n\n".join((folder / f"{n}.txt").read_text(encoding="utf-8") for n in names)
        if book not in names:
            raise ValueError(f"book must be one of {', '.join(names)}; got {book!r}")
        return (folder / f"{book}.txt").read_text(encoding="utf-8")
    if source in ("pg19", "wikitext"):
        return _load_online(source, int(book or 0))
    raise ValueError(
        f"unknown text source {source!r}: give 'austen', 'pg19', 'wikitext' or the path of an existing text file"
    )


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


def tokenize(tokenizer, text: str, n_tokens: int | None = None, device: torch.device | str = "cpu") -> Tensor:
    """Token ids of ``text`` as [1, T] (the first ``n_tokens`` if given), with a clear error if too short."""
    if not text or not text.strip():
        raise ValueError("text is empty: nothing to tokenize")
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    if n_tokens is not None:
        if n_tokens < 1:
            raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
        if ids.shape[1] < n_tokens:
            raise ValueError(f"the text has only {ids.shape[1]} tokens, fewer than n_tokens={n_tokens}")
        ids = ids[:, :n_tokens]
    return ids.to(device)
