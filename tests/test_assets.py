"""Assets: idempotent fetch, corrupt or partial downloads redone and never used, clear errors."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import urllib.request

import pytest

from course import assets
from course.assets import AssetMissing, Download, download, is_complete
from course.data import load_text, tokenize


def make_download(tmp_path, payload: bytes, sha: str | None = None) -> Download:
    src = tmp_path / "source.bin"
    src.write_bytes(payload)
    return Download("thing.bin", (src.as_uri(),), sha or hashlib.sha256(payload).hexdigest(), len(payload))


def test_download_verifies_and_is_idempotent(tmp_path, monkeypatch):
    item = make_download(tmp_path, b"x" * 5000)
    path = download(item, tmp_path / "dl", progress=False)
    assert path.read_bytes() == b"x" * 5000

    def no_network(*a, **k):
        raise AssertionError("a verified file must not be downloaded again")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    assert download(item, tmp_path / "dl", progress=False) == path


def test_partial_file_is_redone(tmp_path):
    item = make_download(tmp_path, b"abc" * 1000)
    target = tmp_path / "dl" / item.filename
    target.parent.mkdir()
    target.write_bytes(b"abc" * 10)  # an interrupted earlier download
    assert download(item, tmp_path / "dl", progress=False).read_bytes() == b"abc" * 1000


def test_corrupt_download_is_refused_and_removed(tmp_path):
    item = make_download(tmp_path, b"good bytes", sha="0" * 64)
    with pytest.raises(AssetMissing, match="checksum"):
        download(item, tmp_path / "dl", progress=False)
    assert list((tmp_path / "dl").iterdir()) == []  # nothing half-written is left to be used


def test_unreachable_source_gives_an_actionable_error(tmp_path):
    item = Download("x.bin", ((tmp_path / "missing.bin").as_uri(),), "0" * 64, 1)
    with pytest.raises(AssetMissing, match="python -m course fetch"):
        download(item, tmp_path / "dl", progress=False)


def test_derived_folder_is_complete_only_with_matching_manifest(tmp_path):
    folder = tmp_path / "derived"
    folder.mkdir()
    (folder / "a.txt").write_text("hello")
    assert not is_complete(folder)
    assets._mark_complete(folder)
    assert is_complete(folder)
    (folder / "a.txt").write_text("hello, truncated?")  # size changed: not trusted
    assert not is_complete(folder)


def test_manifest_quick_and_full_checks(tmp_path):
    """Quick: size, then the hash only when the mtime moved; full: always the hash."""
    from course.manifest import check_folder

    folder = tmp_path / "derived"
    folder.mkdir()
    (folder / "a.txt").write_text("hello world")
    assets._mark_complete(folder, source="test")
    assert check_folder(folder) == [] and check_folder(folder, full=True) == []
    record = json.loads((folder / assets.COMPLETE).read_text())["files"]["a.txt"]
    assert record["size"] == 11 and record["sha256"] == hashlib.sha256(b"hello world").hexdigest()
    (folder / "a.txt").write_text("HELLO world")  # same size, new mtime: hashed, caught
    os.utime(folder / "a.txt", ns=(record["mtime_ns"], record["mtime_ns"] + 1))
    assert "SHA-256" in str(check_folder(folder)[0])
    os.utime(folder / "a.txt", ns=(record["mtime_ns"], record["mtime_ns"]))  # mtime put back: only full sees it
    assert check_folder(folder) == [] and "SHA-256" in str(check_folder(folder, full=True)[0])
    (folder / "a.txt").write_text("hello world")
    os.utime(folder / "a.txt", ns=(record["mtime_ns"], record["mtime_ns"] + 2))
    assert check_folder(folder) == []  # same content, touched: still intact


def test_publish_replaces_a_folder_only_when_the_new_one_is_complete(tmp_path):
    final, new = tmp_path / "final", tmp_path / "new"
    final.mkdir()
    (final / "old.txt").write_text("old")
    new.mkdir()
    (new / "new.txt").write_text("new")
    assets._publish(new, final)
    assert [p.name for p in final.iterdir()] == ["new.txt"] and sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_fetch_is_idempotent_on_a_fetched_cache(monkeypatch):
    assert all(assets.status().values()), "run `python -m course fetch` before the tests"

    def no_network(*a, **k):
        raise AssertionError("fetch must not download what is already there")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    folders = assets.fetch(progress=False)
    assert set(folders) == {"smollm2-135m", "austen"}


def test_missing_asset_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(AssetMissing, match="python -m course fetch"):
        load_text("austen")
    with pytest.raises(AssetMissing, match="python -m course fetch"):
        assets.require("smollm2-135m")


def test_broken_model_folder_is_not_used(tmp_path, monkeypatch):
    src = assets.smollm2_dir()
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    dst = assets.smollm2_dir()
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    (dst / "model.safetensors").write_bytes(b"\0" * 100)  # a truncated copy
    assert not assets.status()["smollm2-135m"]


def test_austen_books_and_local_files(tmp_path):
    pp = load_text("austen", "pride_and_prejudice")
    assert pp.startswith("PRIDE AND PREJUDICE") and "It is a truth universally acknowledged" in pp
    everything = load_text("austen")
    assert len(everything) > 3_500_000 and "EMMA" in everything and "Persuasion" in everything
    with pytest.raises(ValueError, match="book must be one of"):
        load_text("austen", "ulysses")
    f = tmp_path / "t.txt"
    f.write_text("A short local text.")
    assert load_text(str(f)) == "A short local text."
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        load_text(tmp_path / "empty.txt")
    with pytest.raises(ValueError, match="unknown text source"):
        load_text("no-such-corpus")


def test_tokenize_errors(smollm2):
    tok = smollm2[1]
    with pytest.raises(ValueError, match="text is empty"):
        tokenize(tok, "")
    with pytest.raises(ValueError, match="only 3 tokens"):
        tokenize(tok, "Hello there world", 50)
    assert tokenize(tok, "Hello there world", 2).shape == (1, 2)


def test_ar_reader():
    def member(name: bytes, data: bytes) -> bytes:
        header = name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6) + b"100644".ljust(8)
        return header + str(len(data)).encode().ljust(10) + b"`\n" + data + (b"\n" if len(data) % 2 else b"")

    blob = b"!<arch>\n" + member(b"debian-binary/", b"2.0\n") + member(b"data.tar.xz/", b"abc")
    assert assets._read_ar(blob) == {"debian-binary": b"2.0\n", "data.tar.xz": b"abc"}
    with pytest.raises(AssetMissing):
        assets._read_ar(b"not an archive")
