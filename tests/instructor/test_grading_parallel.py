"""Grading at scale: several kernels at once (``grade --jobs``), shards graded by separate processes and merged
(``grade --shard``, ``gradebook merge``): each gives exactly the gradebook of one serial run; an interrupted
parallel run leaves no process and no temporary file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from course.__main__ import main
from course.instructor.grading.shards import RECORD, Shard, shard_index
from course.instructor.grading.submissions import find_submissions
from tests.instructor.grading_helpers import CHECK, GOOD, marked_processes, tiny, wait_for

pytestmark = pytest.mark.slow  # kernels, notebooks or the real model at length: not in the contributor suite

ROOT = Path(__file__).resolve().parents[2]
# one student per outcome; their names put at least one submission in each of three shards (asserted below)
OUTCOMES = {
    "alice": (GOOD, CHECK),  # pass
    "bob": (GOOD.replace("2 *", "1 *", 1), CHECK),  # wrong
    "carol": ("def kv_cache_bytes(*args, **kwargs):\n    raise NotImplementedError()", CHECK),  # not done
    "heidi": ("import os\nos._exit(1)", CHECK),  # the kernel dies
}


def _grade(key: Path, *args: str) -> None:
    assert main(["grade", *args, "--timeout", "60", "--json", "--key", str(key)]) == 0


def _files(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in ("gradebook.json", "gradebook.csv")}


@pytest.fixture(scope="module")
def graded(tmp_path_factory, grading_key) -> dict:
    """The class (one submission per outcome, one that cannot be attributed), graded once serially."""
    root = tmp_path_factory.mktemp("parallel")
    for student, cells in OUTCOMES.items():
        tiny(root / "class" / student / "01_kv_cache.ipynb", *cells)
    tiny(root / "class" / "01_loose.ipynb", GOOD, CHECK)  # not in a student's folder: one error row
    _grade(grading_key, str(root / "class"), "--jobs", "1", "--out", str(root / "serial"))
    return {"root": root, "class": root / "class", "serial": _files(root / "serial"), "key": grading_key}


def test_the_serial_gradebook_has_every_outcome(graded):
    rows = json.loads(graded["serial"]["gradebook.json"])
    kv = {r["student"]: r["status"] for r in rows if r["exercise"] in ("01.kv_cache_bytes", "")}
    assert kv == {"alice": "pass", "bob": "wrong", "carol": "not_done", "heidi": "not_reached",
                  "(unknown)": "error"}


def test_two_jobs_give_the_serial_gradebook_and_resume(graded, capsys):
    out = graded["root"] / "jobs2"
    _grade(graded["key"], str(graded["class"]), "--jobs", "2", "--out", str(out))
    assert _files(out) == graded["serial"]
    capsys.readouterr()
    assert main(["grade", str(graded["class"]), "--jobs", "2", "--out", str(out), "--key", str(graded["key"])]) == 0
    printed = capsys.readouterr().out
    assert "grading " not in printed and printed.count("unchanged since it was graded, kept") == 5
    assert _files(out) == graded["serial"]


def test_the_split_depends_on_student_and_file_name_only(graded, tmp_path):
    subs = find_submissions([graded["class"]])
    split = {(s.student, s.path.name): shard_index(s, 3) for s in subs}
    assert set(split.values()) == {0, 1, 2}  # every shard has work: the merge test below covers all three
    elsewhere = tmp_path / "mounted" / "elsewhere"
    for s in reversed(subs):  # another folder, another listing order: the same split
        if s.student != "(unknown)":
            tiny(elsewhere / s.student / s.path.name)
    assert all(split[(s.student, s.path.name)] == shard_index(s, 3) for s in find_submissions([elsewhere]))
    assert all(sum(Shard(i, 3).holds(s) for i in range(3)) == 1 for s in subs)


def test_shards_in_separate_processes_merge_to_the_serial_gradebook(graded, capsys):
    root, env = graded["root"], {**os.environ, "PYTHONPATH": str(ROOT)}
    tasks = [subprocess.Popen([sys.executable, "-m", "course", "grade", str(graded["class"]), "--shard", f"{i}/3",
                               "--jobs", "1", "--timeout", "60", "--out", str(root / f"shard-{i}"),
                               "--key", str(graded["key"])],
                              env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in range(3)]
    for task in tasks:
        assert task.wait(300) == 0, task.stderr.read()
    records = [json.loads((root / f"shard-{i}" / RECORD).read_text()) for i in range(3)]
    assert [(r["shard"], r["complete"]) for r in records] == [("0/3", True), ("1/3", True), ("2/3", True)]
    assert main(["gradebook", "merge", *(str(root / f"shard-{i}") for i in (2, 0, 1)), "--out",
                 str(root / "merged")]) == 0
    assert "merged 3 shards" in capsys.readouterr().out
    assert _files(root / "merged") == graded["serial"]


def _shard_folder(folder: Path, shard: str, submissions: list[str], complete: bool = True,
                  graded: list[str] | None = None, count_paths: str = "/class") -> Path:
    """A shard's --out folder as ``grade --shard`` leaves it (rows for ``graded``, default all)."""
    folder.mkdir(parents=True)
    index, count = map(int, shard.split("/"))
    row = dict(student="s", notebook="01", exercise="01.kv_cache_bytes", points=1, max_points=1, status="pass",
               feedback="", sha256="0", cells_failed="", isolation="bubblewrap")
    rows = [{**row, "submission": s} for s in (submissions if graded is None else graded)]
    (folder / "gradebook.json").write_text(json.dumps(rows))
    (folder / RECORD).write_text(json.dumps({"shard": shard, "index": index, "count": count, "paths": [count_paths],
                                             "layout": "folders", "submissions": submissions,
                                             "complete": complete}))
    return folder


@pytest.mark.parametrize("case, message", [
    ("missing", "shard 1/3 missing: merge needs all 3 shards' folders"),
    ("twice", "both hold shard 0/3: give each shard's folder once"),
    ("overlap", "/class/a.ipynb is graded in shard 0/3"),
    ("unfinished", "did not finish (0 of 1 submissions graded): run its task again"),
    ("other split", "come from different splits"),
    ("not a shard", "has no shard.json: it was not graded with --shard INDEX/COUNT"),
])
def test_merge_refuses_shards_that_do_not_add_up(tmp_path, capsys, case, message):
    a, b, c = "/class/a.ipynb", "/class/b.ipynb", "/class/c.ipynb"
    folders = [_shard_folder(tmp_path / "s0", "0/3", [a]), _shard_folder(tmp_path / "s1", "1/3", [b]),
               _shard_folder(tmp_path / "s2", "2/3", [c])]
    if case == "missing":
        folders.pop(1)
    elif case == "twice":
        folders[1] = _shard_folder(tmp_path / "again", "0/3", [a])
    elif case == "overlap":
        folders[1] = _shard_folder(tmp_path / "s1b", "1/3", [b], graded=[b, a])
    elif case == "unfinished":
        folders[2] = _shard_folder(tmp_path / "s2b", "2/3", [c], complete=False, graded=[])
    elif case == "other split":
        folders[2] = _shard_folder(tmp_path / "s2b", "2/3", [c], count_paths="/another-class")
    else:
        (folders[2] / RECORD).unlink()
    assert main(["gradebook", "merge", *map(str, folders), "--out", str(tmp_path / "merged")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "merged").exists()


def test_a_shard_folder_is_not_reused_by_another_run(tmp_path, capsys, grading_key):
    folder = _shard_folder(tmp_path / "s0", "0/3", [])
    tiny(tmp_path / "class" / "alice" / "01_kv_cache.ipynb", GOOD, CHECK)
    for other in (["--shard", "1/3"], []):
        assert main(["grade", str(tmp_path / "class"), "--out", str(folder), "--key", str(grading_key), *other]) == 2
        assert "holds the gradebook of shard 0/3" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, allowed", [
    ("--jobs", "0", "must be an integer from 1 to"), ("--jobs", "many", "must be an integer from 1 to"),
    ("--shard", "3/3", "0 <= INDEX < COUNT"), ("--shard", "1", "must be INDEX/COUNT"),
])
def test_bad_jobs_and_shards_are_one_clear_line(tmp_path, capsys, flag, value, allowed):
    with pytest.raises(SystemExit) as exit_:
        main(["grade", str(tmp_path), flag, value, "--key", "key.json"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {flag}: must be" in err and allowed in err, err
    assert err.count("\n") == 1 and f"got {value!r}" in err


def test_sigint_with_two_kernels_running_leaves_nothing(tmp_path, grading_key, short_tmpdir):
    tiny(tmp_path / "class" / "a_quick" / "01_kv_cache.ipynb", GOOD, CHECK)
    for name in ("b_slow", "c_slow"):  # each sleeps (its kernel, in its sandbox, cannot write out to say so)
        tiny(tmp_path / "class" / name / "01_kv_cache.ipynb", "import time\ntime.sleep(600)", GOOD, CHECK)
    out, scratch, mark = tmp_path / "book", short_tmpdir, uuid.uuid4().hex
    env = {**os.environ, "TMPDIR": str(scratch), "COURSE_TEST_MARK": mark, "PYTHONPATH": str(ROOT)}
    grader = subprocess.Popen([sys.executable, "-m", "course", "grade", str(tmp_path / "class"), "--out", str(out),
                               "--jobs", "2", "--timeout", "600", "--key", str(grading_key)], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)

    def kernels() -> list[int]:  # found by their command lines, which name their folder in ``scratch``
        return [pid for pid in marked_processes(str(scratch), ("cmdline",))
                if b"ipykernel_launcher" in Path(f"/proc/{pid}/cmdline").read_bytes()
                and b"bwrap" not in Path(f"/proc/{pid}/cmdline").read_bytes()]

    wait_for(grader, lambda: (out / "gradebook.json").exists() and len(kernels()) >= 2, 180,
             "the quick one was graded and both slow kernels ran")
    time.sleep(5)  # their cells are running: the import, then the sleep
    grader.send_signal(signal.SIGINT)
    stdout, stderr = grader.communicate(timeout=120)
    assert grader.returncode == 130, (stdout, stderr)
    assert "interrupted" in stderr and "Traceback" not in stderr
    rows = json.loads((out / "gradebook.json").read_text())
    assert {r["student"] for r in rows} == {"a_quick"}
    assert sorted(p.name for p in out.iterdir()) == ["gradebook.csv", "gradebook.json"]  # no temporary file
    assert list(scratch.iterdir()) == []  # no kernel's temporary folder
    time.sleep(0.5)
    assert marked_processes(mark) == []  # no grading process
    assert marked_processes(str(scratch), ("environ", "cmdline")) == []  # no supervisor, sandbox or kernel
