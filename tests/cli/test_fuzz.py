"""Bad inputs through the command line and the public API: a table of them, each expected to give
one clean error line (exit status 2) or a correct result, and to change no file it should not.

The damaged caches are copies of the course cache made here (the real one is only read): each
case damages one file, then checks that ``info --verify`` and every load name that file, that
nothing was written, and (for the corpus, whose repair is cheap and offline) that ``fetch``
repairs it. One model repair (deriving the weights again from the kept GGUF) is in
``test_model_damage_is_repaired_by_fetch``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from course import assets
from course.__main__ import main
from course.data import load_text, tokenize, tokenize_file
from course.manifest import MANIFEST, sha256_of

REPO = Path(__file__).resolve().parents[2]
MODEL = "models/smollm2-135m"
NOVELS = "corpora/austen"


# ----------------------------------------------------------------------------- helpers
def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``python -m course`` in-process: (exit status, stdout, stderr)."""
    try:
        rc = main(list(argv))
    except SystemExit as e:  # argparse's usage errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_error_line(rc: int, err: str, pattern: str) -> str:
    """Exit status 2, no traceback, exactly one ``error:`` line, the last one, matching ``pattern``."""
    assert rc == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == err.strip().splitlines()[-1], err
    assert re.search(pattern, errors[0]), errors[0]
    return errors[0]


def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every file under ``roots``: size, modification time, and SHA-256 of the small ones."""
    out = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                st = p.stat()
                out[str(p)] = (st.st_size, st.st_mtime_ns, sha256_of(p) if st.st_size < 8 << 20 else None)
    return out


def make_cache(pristine: Path, dest: Path, copy: tuple[str, ...] = ()) -> Path:
    """A cache at ``dest``: hard links to ``pristine`` (copies where links fail), real copies for ``copy``."""
    for src in sorted(pristine.rglob("*")):
        rel = src.relative_to(pristine)
        target = dest / rel
        if src.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if str(rel) in copy:
            shutil.copy2(src, target)
        else:
            try:
                os.link(src, target)
            except OSError:
                shutil.copy2(src, target)
    return dest


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A private, verified copy of the course cache (models, corpora, and the kept Debian package)."""
    if not all(assets.status().values()):
        pytest.fail("the course cache is missing or damaged: run `python -m course fetch` before the tests")
    src, dest = assets.cache_dir(), tmp_path_factory.mktemp("pristine")
    for rel in (MODEL, NOVELS):
        shutil.copytree(src / rel, dest / rel, copy_function=shutil.copy2)
    deb = src / "downloads" / assets.AUSTEN_DEB.filename
    if deb.is_file():
        (dest / "downloads").mkdir()
        shutil.copy2(deb, dest / "downloads" / deb.name)
    return dest


@pytest.fixture
def cache_copy(pristine, tmp_path, monkeypatch) -> Path:
    """An intact cache of hard links to the pristine copy, set as ``COURSE_CACHE``."""
    cache = make_cache(pristine, tmp_path / "cache")
    monkeypatch.setenv("COURSE_CACHE", str(cache))
    return cache


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Odd input files: a folder, empty, blank, binary, NUL bytes, UTF-16, Latin-1, a late bad byte."""
    d = tmp_path_factory.mktemp("inputs")
    (d / "folder").mkdir()
    (d / "empty.txt").write_bytes(b"")
    (d / "blank.txt").write_text("  \n\n\t\n")
    (d / "binary.bin").write_bytes(bytes(range(256)) * 64)
    (d / "nul.txt").write_bytes(b"hello\x00world " * 100)
    (d / "utf16.txt").write_text("It is a truth universally acknowledged. " * 50, encoding="utf-16")
    (d / "latin1.txt").write_bytes("Caf\u00e9 au lait, s'il vous pla\u00eet. ".encode("latin-1") * 50)
    (d / "short.txt").write_text("A very short text.")
    (d / "late-bad-byte.txt").write_bytes(b"The cache never forgets its first token. " * 30_000 + b"\xff tail")
    return d


@pytest.fixture(scope="module")
def tokenizer(pristine):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(pristine / MODEL))


@pytest.fixture
def read_only(monkeypatch):
    """Make a folder tree read-only. As root, whom permissions do not stop, the write probe is
    also made to fail there as the kernel would for anyone else."""
    made: list[Path] = []

    def apply(root: Path) -> Path:
        for p in [root, *root.rglob("*")]:
            if p.is_dir():
                p.chmod(0o555)
        made.append(root)
        if os.geteuid() == 0:
            real = assets.probe_write

            def probe(folder: Path) -> None:
                if Path(folder).resolve().is_relative_to(root.resolve()):
                    raise PermissionError(13, "Permission denied", str(folder))
                real(folder)

            monkeypatch.setattr(assets, "probe_write", probe)
        return root

    yield apply
    for root in made:
        for p in [root, *root.rglob("*")]:
            if p.is_dir():
                p.chmod(0o755)


# ----------------------------------------------------------------------------- the table: CLI arguments
USAGE_CASES = [
    (["stream", "--tokens", "0"], r"--tokens: must be an integer >= 1, got 0"),
    (["stream", "--tokens", "-5"], r"--tokens: must be an integer >= 1, got -5"),
    (["stream", "--tokens", "1e3"], r"--tokens: must be an integer >= 1, got '1e3'"),
    (["stream", "--budget", "0"], r"--budget: must be an integer >= 1"),
    (["stream", "--passages", "0"], r"--passages: must be an integer >= 1"),
    (["generate", "--prompt", "x", "--max-new-tokens", "0"], r"--max-new-tokens: must be an integer >= 1"),
    (["chat", "--seed", "-3"], r"--seed: must be an integer from 0 to 4294967295"),
    (["stream", "--sinks", "-1"], r"--sinks: must be an integer >= 0"),
    (["stream", "--device", "tpu"], r"--device: must be auto, cpu, cuda"),
    (["stream", "--policy", "lru"], r"--policy: invalid choice"),
    (["needle", "--depth", "1.5"], r"--depth: must be a number from 0 to 1"),
    (["needle", "--depth", "nan"], r"--depth: must be a number from 0 to 1"),
    (["needle", "--budget", "0"], r"--budget: must be an integer >= 1"),
    (["needle", "--seed", str(2**64)], r"--seed: must be an integer from 0 to 4294967295"),
    (["needle", "--trials", "0"], r"--trials: must be an integer >= 1"),
    (["train", "--seed", str(2**64)], r"--seed: must be an integer from 0 to 4294967295"),
    (["train", "--seed", "-1"], r"--seed: must be an integer from 0 to 4294967295, got -1"),
    (["train", "--steps", "0"], r"--steps: must be an integer >= 1"),
    (["train", "--variant", "sinkless"], r"--variant: invalid choice"),
    (["grade", "--timeout", "0", "x.ipynb"], r"--timeout: must be an integer >= 1"),
]


@pytest.mark.parametrize("argv, pattern", USAGE_CASES, ids=[" ".join(a) for a, _ in USAGE_CASES])
def test_bad_arguments_give_one_line(capsys, cache_copy, argv, pattern):
    before = snapshot(cache_copy)
    assert_one_error_line(*run_cli(capsys, *argv)[::2], pattern)
    assert snapshot(cache_copy) == before


RUNTIME_CASES = [  # checked before any model loads
    (["stream", "--corpus", "gutenberg"], r"--corpus must be one of austen, pg19, wikitext"),
    (["stream", "--book", "ulysses"], r"--book must be one of .*'ulysses'"),
    (["fetch", "nope"], r"asset name 'nope' is not known; choose from smollm2-135m, austen"),
]


@pytest.mark.parametrize("argv, pattern", RUNTIME_CASES, ids=[" ".join(a) for a, _ in RUNTIME_CASES])
def test_bad_values_give_one_line(capsys, cache_copy, argv, pattern):
    before = snapshot(cache_copy)
    assert_one_error_line(*run_cli(capsys, *argv)[::2], pattern)
    assert snapshot(cache_copy) == before


# ----------------------------------------------------------------------------- the table: text files
TEXT_CASES = [
    ("folder", r"is a directory, not a text file"),
    ("", r"--text-file must be the path of a UTF-8 text file, got ''"),
    ("no-such-file.txt", r"does not exist"),
    ("empty.txt", r"is empty"),
    ("blank.txt", r"is empty"),
    ("binary.bin", r"is not UTF-8 text: invalid start byte at byte 128"),
    ("nul.txt", r"contains NUL bytes \(at byte 5\)"),
    ("utf16.txt", r"is not UTF-8 text: .* at byte 0; it looks like UTF-16"),
    ("latin1.txt", r"is not UTF-8 text: .* at byte 3"),
]


@pytest.mark.parametrize("name, pattern", TEXT_CASES, ids=[n or "empty-path" for n, _ in TEXT_CASES])
def test_bad_text_files(capsys, cache_copy, inputs, name, pattern):
    path = str(inputs / name) if name else ""
    before = snapshot(cache_copy, inputs)
    line = assert_one_error_line(*run_cli(capsys, "stream", "--text-file", path, "--tokens", "32")[::2], pattern)
    assert f"--text-file {path!r}" in line or not name  # names the parameter and the file
    assert snapshot(cache_copy, inputs) == before
    if name and name != "no-such-file.txt":
        with pytest.raises(ValueError, match=pattern.replace("--text-file", "")):
            load_text(inputs / name)


def test_text_shorter_than_tokens(capsys, cache_copy, inputs):
    rc, _, err = run_cli(capsys, "stream", "--text-file", str(inputs / "short.txt"), "--tokens", "500", "--json")
    assert_one_error_line(rc, err, r"the text has only \d+ tokens, fewer than n_tokens=500")


def test_text_is_read_only_as_far_as_needed(tokenizer, inputs):
    """A bad byte after 1.2 MB does not matter for 32 tokens; the ids equal those of the whole text."""
    path = inputs / "late-bad-byte.txt"
    ids = tokenize_file(tokenizer, path, 32)
    good = path.read_bytes()[:-6].decode()
    assert torch.equal(ids, tokenizer(good, return_tensors="pt", add_special_tokens=False).input_ids[:, :32])
    with pytest.raises(ValueError, match=r"late-bad-byte.txt' is not UTF-8 text: invalid start byte at byte 1230000"):
        tokenize_file(tokenizer, path)  # all of it: the bad byte is reached and named
    long = "Emma Woodhouse, handsome, clever, and rich. " * 5000
    assert torch.equal(tokenize(tokenizer, long, 700),
                       tokenizer(long, return_tensors="pt", add_special_tokens=False).input_ids[:, :700])
    bom = inputs.parent / "bom.txt"
    bom.write_bytes(b"\xef\xbb\xbfHello there")
    assert load_text(bom) == "Hello there"


@pytest.mark.parametrize("n", [0, -1, True, "5", 2.0])
def test_tokenize_rejects_bad_counts(tokenizer, n):
    with pytest.raises(ValueError, match="n_tokens must be an integer >= 1"):
        tokenize(tokenizer, "Hello there", n)


# ----------------------------------------------------------------------------- the table: the cache folder
def test_cache_that_is_a_file_or_cannot_be_created(capsys, tmp_path, monkeypatch):
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("x")
    for cache, why in ((a_file, "it is a file, not a folder"), (a_file / "sub", r"it cannot be created \(Not a directory\)")):
        monkeypatch.setenv("COURSE_CACHE", str(cache))
        for argv in (["info"], ["stream", "--tokens", "8"], ["fetch"], ["train", "--steps", "1"]):
            assert_one_error_line(*run_cli(capsys, *argv)[::2], rf"the course cache {re.escape(str(cache))} cannot be used: {why}")
    assert a_file.read_text() == "x" and list(tmp_path.iterdir()) == [a_file]


def test_fetch_on_a_read_only_cache(capsys, cache_copy, read_only):
    read_only(cache_copy)
    before = snapshot(cache_copy)
    rc, out, err = run_cli(capsys, "fetch")  # everything intact: nothing to write, a correct result
    assert rc == 0 and "smollm2-135m: ready" in out and "austen: ready" in out
    line = assert_one_error_line(*run_cli(capsys, "fetch", "--force")[::2], r"is not writable")
    assert str(cache_copy) in line and "ready" not in line
    assert snapshot(cache_copy) == before


@pytest.mark.parametrize("command", [["bench", "--quick"], ["grade", "x.ipynb"]])
def test_output_folder_is_checked_before_the_work(capsys, tmp_path, monkeypatch, command, grading_key):
    import course.instructor.bench as bench_module
    from course.instructor.grading import grade as grade_module

    monkeypatch.setattr(bench_module, "run_bench", lambda *a, **k: pytest.fail("the benchmark started"))
    monkeypatch.setattr(grade_module, "grade", lambda *a, **k: pytest.fail("grading started"))
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    if command[0] == "grade":  # an existing submission: the paths are checked first
        (tmp_path / "alice").mkdir()
        (tmp_path / "alice" / "x.ipynb").write_text("{}")
        command = ["grade", str(tmp_path / "alice" / "x.ipynb"), "--key", str(grading_key)]
    line = assert_one_error_line(*run_cli(capsys, *command, "--out", str(a_file / "sub"))[::2],
                                 r"--out .* (is not a writable folder|cannot be written to) \(Not a directory\)")
    assert str(a_file) in line and a_file.read_text() == "x"


# ----------------------------------------------------------------------------- the table: damaged files
def tensor_bytes(path: Path, name: str) -> tuple[int, int]:
    """(offset, length) of a tensor's data in a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        start, end = json.loads(f.read(n))[name]["data_offsets"]
    return 8 + n + start, end - start


def fill_tensor(name: str, value: float) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        offset, length = tensor_bytes(path, name)
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(struct.pack("<f", value) * (length // 4))
    return damage


def overwrite(offset: int, data: bytes) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(data)
    return damage


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def delete(path: Path) -> None:
    path.unlink()


def sizes_only(path: Path) -> None:  # the manifest an older version wrote
    files = json.loads(path.read_text())["files"]
    path.write_text(json.dumps({"files": {k: v["size"] for k, v in files.items()}}))


@dataclass(frozen=True)
class Damage:
    id: str
    file: str  # relative to the cache
    damage: Callable[[Path], None]
    pattern: str

    @property
    def asset(self) -> str:
        return "smollm2-135m" if self.file.startswith(MODEL) else "austen"


SHA = r"content differs from the recorded SHA-256"
DAMAGES = [
    Damage("model-layer-zeroed", f"{MODEL}/model.safetensors", fill_tensor("model.layers.3.self_attn.q_proj.weight", 0.0), SHA),
    Damage("model-final-norm-overwritten", f"{MODEL}/model.safetensors", fill_tensor("model.norm.weight", 3e38), SHA),
    Damage("model-header-corrupt", f"{MODEL}/model.safetensors", overwrite(8, b'{"garbage": [1, 2'), SHA),
    Damage("model-truncated", f"{MODEL}/model.safetensors", truncate, r"size \d+ bytes, expected 538090408"),
    Damage("model-deleted", f"{MODEL}/model.safetensors", delete, r"model.safetensors: missing"),
    Damage("tokenizer-edited", f"{MODEL}/tokenizer.json", overwrite(100, b"#"), SHA),
    Damage("model-manifest-garbage", f"{MODEL}/{MANIFEST}", overwrite(0, b"{{{{"), r"unreadable manifest"),
    Damage("novel-first-4kb-overwritten", f"{NOVELS}/emma.txt", overwrite(0, b"x" * 4096), SHA),
    Damage("novel-invalid-utf8", f"{NOVELS}/persuasion.txt", overwrite(1000, b"\xff\xfe"), SHA),
    Damage("novel-truncated", f"{NOVELS}/mansfield_park.txt", truncate, r"size \d+ bytes, expected \d+"),
    Damage("novel-deleted", f"{NOVELS}/emma.txt", delete, r"emma.txt: missing"),
    Damage("corpus-manifest-without-checksums", f"{NOVELS}/{MANIFEST}", sizes_only, r"no checksums recorded"),
]


def offline(*args, **kwargs):
    """``urlopen`` without a network: a repair that needs a download fails."""
    raise OSError("no network in this test")


@pytest.mark.slow
@pytest.mark.parametrize("case", DAMAGES, ids=[d.id for d in DAMAGES])
def test_damaged_file_is_named_never_used_and_repaired(case, pristine, tmp_path, capsys, monkeypatch):
    cache = make_cache(pristine, tmp_path / "cache", copy=(case.file,))
    monkeypatch.setenv("COURSE_CACHE", str(cache))
    case.damage(cache / case.file)
    before = snapshot(cache)
    name = Path(case.file).name
    repair = rf"run `python -m course fetch {case.asset}` to repair it"

    rc, out, _ = run_cli(capsys, "info")  # the cheap check already sees it
    assert rc == 0 and re.search(rf"DAMAGED: .*{re.escape(name)}", out), out
    line = assert_one_error_line(*run_cli(capsys, "info", "--verify")[::2], case.pattern)
    assert name in line and repair in line
    # every way in stops before a model loads or a text is read, with the same line
    argv = ["stream", "--tokens", "16", "--json"]
    line = assert_one_error_line(*run_cli(capsys, *argv)[::2], rf"{case.pattern}.*{re.escape(repair)}")
    assert str(cache / case.file) in line or str(cache / Path(case.file).parent / MANIFEST) in line
    with pytest.raises(assets.AssetDamaged, match=re.escape(name)):
        load_text("austen") if case.asset == "austen" else assets.require("smollm2-135m")
    assert snapshot(cache) == before  # nothing written, nothing "fixed" behind the user's back

    if case.asset != "austen":
        return  # the model's repair (about 20 s) is tested once, below
    if (cache / "downloads" / assets.AUSTEN_DEB.filename).is_file():  # repaired offline from the kept package
        monkeypatch.setattr(urllib.request, "urlopen", offline)
    rc, out, err = run_cli(capsys, "fetch", "austen")
    assert rc == 0 and "austen: ready" in out, err
    assert run_cli(capsys, "info", "--verify")[0] == 0
    for novel in (pristine / NOVELS).glob("*.txt"):
        assert sha256_of(cache / NOVELS / novel.name) == sha256_of(novel)
    after = snapshot(cache)
    outside = {k: v for k, v in before.items() if f"/{NOVELS}/" not in k}
    assert {k: after.get(k) for k in outside} == outside  # only the corpus folder was rewritten


def test_damage_with_mtime_restored_is_found_by_verify(pristine, tmp_path, capsys, monkeypatch):
    """The cheap check trusts size + mtime; ``info --verify`` hashes every file."""
    rel = f"{NOVELS}/northanger_abbey.txt"
    cache = make_cache(pristine, tmp_path / "cache", copy=(rel,))
    monkeypatch.setenv("COURSE_CACHE", str(cache))
    st = (cache / rel).stat()
    overwrite(5000, b"!" * 10)(cache / rel)
    os.utime(cache / rel, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert run_cli(capsys, "info")[0] == 0
    assert_one_error_line(*run_cli(capsys, "info", "--verify")[::2], rf"northanger_abbey.txt: {SHA}")


def test_fetch_of_a_damaged_asset_on_a_read_only_cache(pristine, tmp_path, capsys, monkeypatch, read_only):
    rel = f"{NOVELS}/emma.txt"
    cache = make_cache(pristine, tmp_path / "cache", copy=(rel,))
    monkeypatch.setenv("COURSE_CACHE", str(cache))
    truncate(cache / rel)
    read_only(cache)
    before = snapshot(cache)
    assert_one_error_line(*run_cli(capsys, "fetch", "austen")[::2], r"cannot be used: .* is not writable")
    assert snapshot(cache) == before


# ----------------------------------------------------------------------------- the table: training
TRAIN = ["train", "--steps", "2", "--windows", "2", "--json"]


def stored_run(cache: Path) -> Path:
    (run,) = (cache / "runs").iterdir()
    return run


def test_train_on_a_read_only_cache_fails_before_training(capsys, tmp_path, monkeypatch, read_only):
    from course.training import loop as training_loop

    cache = tmp_path / "cache"
    (cache / "runs").mkdir(parents=True)
    monkeypatch.setenv("COURSE_CACHE", str(cache))
    read_only(cache)
    monkeypatch.setattr(training_loop, "_optimizer", lambda *a: pytest.fail("training started"))
    assert_one_error_line(*run_cli(capsys, *TRAIN)[::2], r"cannot save the run: .*runs is not writable")
    assert list((cache / "runs").iterdir()) == []


@pytest.mark.parametrize("file, damage", [("model.pt", truncate), ("log.json", truncate), ("log.json", delete),
                                          ("model.pt", overwrite(200, b"\0" * 64))])
def test_damaged_stored_run_is_trained_again_or_refused(capsys, tmp_path, monkeypatch, read_only, file, damage):
    cache = tmp_path / "cache"
    monkeypatch.setenv("COURSE_CACHE", str(cache))
    first = json.loads(run_cli(capsys, *TRAIN)[1])
    run = stored_run(cache)
    assert run_cli(capsys, *TRAIN)[0] == 0  # intact: loaded
    damage(run / file)
    rc, out, err = run_cli(capsys, *TRAIN)
    assert rc == 0 and "is damaged" in err and "training it again" in err and "Traceback" not in err
    again = json.loads(out)
    assert again["loaded_from_cache"] is False and again["final_loss"] == first["final_loss"]  # same seed, same run
    assert json.loads(run_cli(capsys, *TRAIN)[1])["loaded_from_cache"] is True  # rewritten intact
    damage(run / file)
    read_only(cache)
    before = snapshot(cache)
    assert_one_error_line(*run_cli(capsys, *TRAIN)[::2], r"stored run .* is damaged .* cannot be trained again")
    assert snapshot(cache) == before


# ----------------------------------------------------------------------------- the table: the public API
@pytest.mark.slow
def test_notebook_parameters_are_typed(monkeypatch, capsys):
    from course.notebook import configure, configure_parameters

    monkeypatch.delenv("COURSE_FAST", raising=False)
    monkeypatch.delenv("COURSE_MODEL", raising=False)
    assert configure("False", "auto", "0") == (False, "auto")  # papermill -r passes strings
    assert configure("True", "smollm2-135m") == (True, "smollm2-135m")
    assert configure(False, "gpt2", 3) == (False, "gpt2")
    assert tuple(configure_parameters("false", "auto", "7", "cpu", "False")) == (False, "auto", "cpu", False, 7)
    bad = [
        (("notabool", "auto"), {}, r"FAST must be True, False or \"auto\", got 'notabool' \(str\)"),
        ((1, "auto"), {}, r"FAST must be True, False or \"auto\", got 1 \(int\)"),
        ((False, "gpt-9"), {}, r"MODEL: model must be one of auto, gpt2, smollm2-135m, gpt2-random, gpt2-tiny-random, "
                                r"or a Hugging "
                                r"Face checkpoint \(org/name, or a local folder\); got 'gpt-9'"),
        ((False, "auto", -1), {}, r"SEED must be an integer from 0 to 4294967295, got -1"),
        ((False, "auto", 2**64), {}, r"SEED must be an integer"),
        ((False, "auto", 1.5), {}, r"SEED must be an integer"),
        ((False, "auto", 0, "tpu"), {}, r"DEVICE must be auto, cpu, cuda, cuda:N or mps, got 'tpu'"),
        ((False, "auto", 0, "cpu", "maybe"), {}, r"AUTOFILL must be True or False, got 'maybe'"),
    ]
    for args, kwargs, pattern in bad:
        with pytest.raises(ValueError, match=pattern):
            configure_parameters(*args, **kwargs)
    monkeypatch.setenv("COURSE_MODEL", "gpt-9")
    with pytest.raises(ValueError, match="COURSE_MODEL: model must be one of"):
        configure(False, "auto")
    monkeypatch.delenv("COURSE_MODEL")
    assert configure(False, None) == (False, None)  # a notebook that trains its own models
    assert configure(False, "gpt2-random") == (False, "gpt2-random")
    # "auto" (every notebook's default): the small sizes on a CPU, the full sizes on a GPU
    assert configure_parameters("auto", "auto", 0, "cpu").fast is True
    assert configure_parameters(" AUTO ", "auto", 0, "cpu").fast is True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert configure_parameters("auto", "auto", 0, "auto").fast is False
    assert configure_parameters("auto", "auto", 0, "cpu").fast is True  # a GPU there, but the CPU asked for
    monkeypatch.setenv("COURSE_FAST", "0")  # the environment forces either size
    assert configure_parameters(True, "auto", 0, "cpu").fast is False
    monkeypatch.setenv("COURSE_FAST", "1")
    assert configure_parameters(False, "auto", 0, "cpu").fast is True
    monkeypatch.setenv("COURSE_FAST", "yes")
    with pytest.raises(ValueError, match=r"COURSE_FAST must be 1 \(small sizes\) or 0 \(full sizes\), got 'yes'"):
        configure_parameters(False, "auto", 0, "cpu")


@pytest.mark.parametrize("autofill", ["False", "True", 0, 1, None])
def test_check_autofill_takes_only_booleans(autofill, monkeypatch):
    from course.exercises import check
    from course.exercises.checking import get
    from course.exercises.core import REGISTRY

    get("01.kv_cache_bytes")
    monkeypatch.delenv("COURSE_GRADE_OUT", raising=False)
    with pytest.raises(TypeError, match=rf"autofill must be True or False, got {re.escape(repr(autofill))}"):
        check("01.kv_cache_bytes", REGISTRY["01.kv_cache_bytes"].fallback, autofill=autofill)


def test_train_config_and_fetch_arguments():
    from course.train import TrainConfig

    for kwargs, pattern in (({"seed": 2**64}, "seed must be an integer from 0 to"), ({"seed": -1}, "seed must be"),
                            ({"steps": "5"}, "steps must be an integer, got '5'"), ({"batch": 0}, "batch must be >= 1")):
        with pytest.raises(ValueError, match=pattern):
            TrainConfig(**kwargs)
    with pytest.raises(ValueError, match="asset name 'gpt2' is not known"):
        assets.fetch(("gpt2",))


def test_cache_dtype_and_size(capsys):
    from course.kvcache import KVCache
    from course.policies import H2O
    from tests.conftest import tiny_model

    model = tiny_model("llama", dtype=torch.float32)
    ids = torch.randint(0, 97, (1, 10))
    with pytest.raises(ValueError, match=r"cache dtype torch.float16 does not match the model's torch.float32"):
        model(ids, cache=KVCache(2, 1, 2, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 1"):
        model.new_cache(1, max_tokens=0)
    cache = model.new_cache(1, H2O(50_000, 50_000))  # a budget of 100000 slots on a 140-token stream
    model(torch.randint(0, 97, (1, 140)), cache=cache)
    for _ in range(3):
        model(torch.randint(0, 97, (1, 1)), cache=cache)
    slots = cache.allocated_bytes // (2 * 2 * 1 * 2 * 8 * 4)  # K+V, layers, batch, kv heads, head_dim, float32
    assert 143 <= slots <= 2 * 143, slots  # min(budget, tokens) up to doubling, not 100001
    exact = model.new_cache(1, H2O(50_000, 50_000), max_tokens=143)
    assert exact.allocated_bytes == 143 * 2 * 2 * 2 * 8 * 4


# ----------------------------------------------------------------------------- costs proportional to the work
def peak_rss_mib(argv: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    """Peak resident memory (MiB) of ``python -m course ...`` in a subprocess (measured by a small
    wrapper process, so that only that run counts)."""
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(r.returncode); "
            "sys.stdout.write(r.stdout); sys.stderr.write(r.stderr)")
    done = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "course", *argv],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    kib, rc, out = done.stdout.split("\n", 2)
    return int(kib) / 1024, subprocess.CompletedProcess(argv, int(rc), out, done.stderr)


@pytest.mark.slow
def test_peak_memory_of_a_short_stream_over_a_50_mb_file(tmp_path, pristine):
    """``stream --tokens 32`` on a 50 MB file stays under 1.5 GiB (most of it the model), and costs
    about what it costs on a 2 KB file: the file is read only as far as 32 tokens need."""
    big, small = tmp_path / "big.txt", tmp_path / "small.txt"
    text = (pristine / NOVELS / "emma.txt").read_text(encoding="utf-8")
    with open(big, "w", encoding="utf-8") as f:
        while f.tell() < 50_000_000:
            f.write(text)
    small.write_text(text[:2000], encoding="utf-8")
    env = {**os.environ, "COURSE_CACHE": str(pristine), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    peaks = {}
    for f in (small, big):
        peaks[f.name], done = peak_rss_mib(["stream", "--text-file", str(f), "--tokens", "32", "--json"], env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout)["tokens"] == 32
    print(f"peak RSS: {peaks}")
    # a CUDA build of torch maps its GPU libraries even on a CPU (about 360 MiB more); the course's share is the same
    assert peaks["big.txt"] < (1536 if torch.version.cuda is None else 1536 + 512), peaks
    assert peaks["big.txt"] - peaks["small.txt"] < 100, peaks


@pytest.mark.slow
def test_model_damage_is_repaired_by_fetch(pristine, tmp_path, capsys, monkeypatch):
    """The zeroed-layer case end to end: detected, then derived again from the kept GGUF (about
    20 s and 1 GB), offline, identical to the original."""
    gguf = assets.cache_dir() / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf.is_file():
        pytest.fail(f"{gguf} is missing: `python -m course fetch` keeps it in the cache")
    rel = f"{MODEL}/model.safetensors"
    cache = make_cache(pristine, tmp_path / "cache", copy=(rel,))
    (cache / "downloads").mkdir(exist_ok=True)
    os.link(gguf, cache / "downloads" / gguf.name) if gguf.stat().st_dev == cache.stat().st_dev else shutil.copy2(
        gguf, cache / "downloads" / gguf.name)
    monkeypatch.setenv("COURSE_CACHE", str(cache))
    fill_tensor("model.layers.3.self_attn.q_proj.weight", 0.0)(cache / rel)
    assert run_cli(capsys, "info", "--verify")[0] == 2
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    rc, out, err = run_cli(capsys, "fetch", "smollm2-135m")
    assert rc == 0 and "smollm2-135m: ready" in out, err
    assert run_cli(capsys, "info", "--verify")[0] == 0
    assert sha256_of(cache / rel) == sha256_of(pristine / rel)
