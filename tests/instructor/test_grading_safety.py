"""Identity of submissions, the gradebook (incremental, atomic, resumable, escaped), interrupted runs,
the wire between grader and kernel, and a release that never destroys."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest
import torch

from course.__main__ import main
from course.exercises import wire
from course.instructor.grading.grade import Limits, grade
from course.instructor.grading.gradebook import Gradebook, csv_cell
from course.instructor.release import BANNER_ID, ReleaseError, release
from course.instructor.grading.remote import _Handles
from course.instructor.grading.submissions import UNKNOWN_STUDENT, find_submissions
from tests.instructor.grading_helpers import CHECK, GOOD, marked_processes as _marked_processes, tiny as _tiny, wait_for

pytestmark = pytest.mark.slow  # kernels, notebooks or the real model at length: not in the contributor suite

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- identity
def _touch(root: Path, *names: str) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("{}")


def _identities(root: Path, layout: str) -> dict[str, tuple[str, str | None, str | None]]:
    return {str(s.path.relative_to(root)): (s.student, s.notebook, s.problem and s.problem.split(":")[0])
            for s in find_submissions([root], layout)}


def test_folder_layout(tmp_path):
    _touch(tmp_path, "alice/01_kv.ipynb", "alice/ps2/02_sinks.ipynb", "bob/alice__01_kv.ipynb", "loose_01.ipynb",
           "=1+2/01_kv.ipynb")
    assert _identities(tmp_path, "folders") == {
        "alice/01_kv.ipynb": ("alice", "01", None),
        "alice/ps2/02_sinks.ipynb": ("alice", "02", None),  # the first folder below PATH names the student
        "bob/alice__01_kv.ipynb": ("bob", None, "the file name does not start with a notebook number (e.g. 01_kv_cache.ipynb) (names like alice__01_... belong to --layout flat)"),
        "loose_01.ipynb": (UNKNOWN_STUDENT, None, "not inside a student's folder"),
        "=1+2/01_kv.ipynb": (UNKNOWN_STUDENT, "01", "the student name '=1+2' is not allowed"),
    }


def test_flat_layout(tmp_path):
    _touch(tmp_path, "a__b__01_kv.ipynb", "__01_kv.ipynb", "01_kv.ipynb", "bob/alice__01_kv.ipynb")
    assert _identities(tmp_path, "flat") == {
        "a__b__01_kv.ipynb": ("a__b", "01", None),  # split on the last "__"
        "__01_kv.ipynb": (UNKNOWN_STUDENT, "01", "the student name '' is not allowed"),
        "01_kv.ipynb": (UNKNOWN_STUDENT, None, "the file name has no STUDENT__ prefix (--layout flat expects STUDENT__NN_name.ipynb)"),
        "bob/alice__01_kv.ipynb": (UNKNOWN_STUDENT, None, "in a subfolder"),
    }


def test_duplicates_are_reported_not_summed(tmp_path, grading_key):
    _touch(tmp_path, "alice/01_kv.ipynb", "alice/again/01_kv_cache.ipynb", "alice/02_x.ipynb")
    subs = {str(s.path.relative_to(tmp_path)): s for s in find_submissions([tmp_path])}
    assert subs["alice/02_x.ipynb"].problem is None
    for name in ("alice/01_kv.ipynb", "alice/again/01_kv_cache.ipynb"):
        assert subs[name].problem.startswith("duplicate: alice has 2 submissions of notebook 01")
    rows = [r for r in grade([tmp_path], timeout=30, key=grading_key) if r["notebook"] == "01"]
    from course.exercises import REGISTRY

    per_copy = sum(1 for name in REGISTRY if name.startswith("01."))  # one row per exercise and question
    assert len(rows) == 2 * per_copy and all(r["status"] == "duplicate" and r["points"] == 0 for r in rows)


def test_bad_layout_is_one_clear_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["grade", str(tmp_path), "--layout", "mixed", "--key", "key.json"])
    assert exit_.value.code == 2
    assert "--layout: invalid choice: 'mixed' (choose from 'folders', 'flat')" in capsys.readouterr().err


# ----------------------------------------------------------------------------- gradebook
def test_csv_cells_cannot_be_formulas(tmp_path):
    assert [csv_cell(v) for v in ("=1+2", "+1", "-1", "@SUM(A1)", "\tx", "alice", 3)] == \
           ["'=1+2", "'+1", "'-1", "'@SUM(A1)", "'\tx", "alice", 3]
    book = Gradebook(tmp_path)
    row = dict(student="alice", notebook="01", exercise="01.x", points=0, max_points=1, status="error",
               feedback='=HYPERLINK("http://x")', submission="/s", sha256="0")
    book.replace("/s", [row])
    [read] = list(csv.DictReader(open(book.csv_path, newline="")))
    assert read["feedback"] == "'" + row["feedback"]
    assert json.loads(book.json_path.read_text())[0]["feedback"] == row["feedback"]


def test_unusable_out_is_refused_before_grading(tmp_path, capsys, grading_key):
    submission = _tiny(tmp_path / "class" / "alice" / "01_kv_cache.ipynb", GOOD, CHECK)
    (tmp_path / "taken").write_text("not a folder")
    start = time.monotonic()
    assert main(["grade", str(submission.parent.parent), "--out", str(tmp_path / "taken"), "--key", str(grading_key)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out") and "is a file, not a folder" in err and "Traceback" not in err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "gradebook.json").write_text("{ half a file")
    assert main(["grade", str(submission.parent.parent), "--out", str(tmp_path / "bad"), "--key", str(grading_key)]) == 2
    assert "is not a readable gradebook" in capsys.readouterr().err
    assert time.monotonic() - start < 5  # refused up front, nothing was run


def test_second_run_keeps_unchanged_submissions(tmp_path, capsys, grading_key):
    alice = _tiny(tmp_path / "class" / "alice" / "01_kv_cache.ipynb", GOOD, CHECK)
    _tiny(tmp_path / "class" / "bob" / "01_kv_cache.ipynb", GOOD.replace("2 *", "1 *", 1), CHECK)
    out = tmp_path / "book"
    assert main(["grade", str(tmp_path / "class"), "--out", str(out), "--timeout", "60", "--key", str(grading_key)]) == 0
    first = json.loads((out / "gradebook.json").read_text())
    assert capsys.readouterr().out.count("grading ") == 2
    _tiny(alice, "def kv_cache_bytes(*args, **kwargs):\n    raise NotImplementedError()", CHECK)  # alice changed
    assert main(["grade", str(tmp_path / "class"), "--out", str(out), "--timeout", "60", "--key", str(grading_key)]) == 0
    printed = capsys.readouterr().out
    assert "bob/01_kv_cache.ipynb: unchanged since it was graded, kept" in printed and printed.count("grading ") == 1
    second = json.loads((out / "gradebook.json").read_text())
    assert [r for r in second if r["student"] == "bob"] == [r for r in first if r["student"] == "bob"]
    kv = {r["student"]: r["status"] for r in second if r["exercise"] == "01.kv_cache_bytes"}
    assert kv == {"alice": "not_done", "bob": "wrong"}


def test_sigterm_leaves_a_valid_partial_gradebook_and_nothing_else(tmp_path, grading_key, short_tmpdir):
    _tiny(tmp_path / "class" / "alice" / "01_kv_cache.ipynb", GOOD, CHECK)
    _tiny(tmp_path / "class" / "bob" / "01_kv_cache.ipynb", "import time\ntime.sleep(600)", GOOD, CHECK)
    out, scratch, mark = tmp_path / "book", short_tmpdir, uuid.uuid4().hex
    env = {**os.environ, "TMPDIR": str(scratch), "COURSE_TEST_MARK": mark, "PYTHONPATH": str(ROOT)}
    grader = subprocess.Popen([sys.executable, "-m", "course", "grade", str(tmp_path / "class"), "--out", str(out),
                               "--key", str(grading_key),
                               "--timeout", "600"], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    wait_for(grader, (out / "gradebook.json").exists, 120, "alice's row was written")
    time.sleep(3)  # bob's kernel is sleeping now
    grader.send_signal(signal.SIGTERM)
    stdout, stderr = grader.communicate(timeout=60)
    assert grader.returncode == 130, (stdout, stderr)
    assert "interrupted" in stderr and "Traceback" not in stderr
    rows = json.loads((out / "gradebook.json").read_text())
    assert {r["student"] for r in rows} == {"alice"} and sum(r["points"] for r in rows) == 1
    assert len(list(csv.DictReader(open(out / "gradebook.csv", newline="")))) == len(rows)
    assert sorted(p.name for p in out.iterdir()) == ["gradebook.csv", "gradebook.json"]
    assert list(scratch.iterdir()) == []  # no temporary folder left
    time.sleep(0.5)
    assert _marked_processes(mark) == []  # neither the kernel nor its supervisor


def test_a_cell_that_prints_too_much_is_interrupted(tmp_path, grading_key):
    flood = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 2**20)\n    sys.stdout.flush()\n"
    _tiny(tmp_path / "class" / "alice" / "01_kv_cache.ipynb", flood + GOOD, CHECK)
    rows = {r["exercise"]: r for r in grade([tmp_path / "class"], timeout=60, limits=Limits(output_mb=1),
                                            key=grading_key)}
    kv = rows["01.kv_cache_bytes"]  # its function is defined after the flood, so never
    assert kv["status"] == "not_reached" and "OutputLimit: interrupted after printing more than 1 MB" in kv["feedback"]


# ----------------------------------------------------------------------------- the wire
def test_only_plain_data_crosses_the_wire():
    import pickle
    import socket

    a, b = socket.socketpair()
    with a, b:
        class Evil:
            def __reduce__(self):
                return (os.system, ("echo pwned",))
        payload = pickle.dumps(Evil(), protocol=2)
        a.sendall(wire._HEADER.pack(len(payload)) + payload)
        with pytest.raises(wire.WireError, match="not a plain-data message"):
            wire.recv(b)
        a.sendall(wire._HEADER.pack(wire.MAX_FRAME + 1))
        with pytest.raises(wire.WireError, match="over the"):
            wire.recv(b)
    value = {"t": torch.arange(4)[1:3], "s": {3, 1}, "r": range(2), "g": (i for i in ())}
    plain = wire.to_plain(value, lambda obj: wire.Opaque(type(obj).__name__, ""))
    assert plain["t"].untyped_storage().nbytes() == 2 * 8 and plain["r"] == [0, 1] and plain["s"] == {1, 3}
    assert isinstance(plain["g"], wire.Opaque)
    a, b = socket.socketpair()
    with a, b:  # a model's device travels as a value (student code calls prompt.to(model.device))
        wire.send(a, wire.to_plain({"device": torch.device("cpu"), "dtype": torch.float32}, None))
        assert wire.recv(b) == {"device": torch.device("cpu"), "dtype": torch.float32}


def test_kept_objects_expose_calls_and_public_attributes_only():
    from course.exercises.fixtures import tiny_model
    from course.exercises.guards import GuardedModel

    handles = _Handles()
    model = tiny_model()
    guarded = GuardedModel(model)
    ref = handles.export(guarded).id
    assert handles.perform("getattr", ref, "calls", (), {}) == []
    with pytest.raises(AttributeError):
        handles.perform("getattr", ref, "__class__", (), {})
    with pytest.raises(AttributeError, match="not available"):  # the guard exposes nothing but its own calls
        handles.perform("getattr", ref, "load_state_dict", (), {})
    raw = handles.export(model).id  # a plain module: its torch methods are refused
    load = handles.export(handles.perform("getattr", raw, "load_state_dict", (), {})).id
    with pytest.raises(TypeError, match="torch methods"):
        handles.perform("call", load, None, ({},), {})
    logits = handles.perform("call", ref, None, (torch.tensor([[1, 2]]),), {}).logits
    assert logits.shape == (1, 2, 53) and guarded.calls == [2]


# ----------------------------------------------------------------------------- release
def _solutions(folder: Path) -> Path:
    folder.mkdir(parents=True)
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("Markers look like `### BEGIN SOLUTION` … `### END SOLUTION`.", id="intro"),
        nbformat.v4.new_markdown_cell("Why?\n### BEGIN SOLUTION\nBecause of the sink.\n### END SOLUTION", id="why"),
        nbformat.v4.new_raw_cell("### BEGIN SOLUTION\nraw answer\n### END SOLUTION", id="raw"),
        nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION", id="code"),
    ])
    nbformat.write(nb, folder / "09_x.ipynb")
    return folder


def test_release_strips_every_cell_type(tmp_path):
    [path] = release(_solutions(tmp_path / "solutions"), tmp_path / "student")
    cells = {c.id: c.source for c in nbformat.read(path, as_version=4).cells}
    assert cells["intro"] == "Markers look like `### BEGIN SOLUTION` … `### END SOLUTION`."
    assert cells["why"] == "Why?\nYOUR ANSWER HERE" and cells["raw"] == "YOUR ANSWER HERE"
    assert cells["code"] == "def f():\n    raise NotImplementedError()" and cells[BANNER_ID]
    assert "Because" not in path.read_text() and "raw answer" not in path.read_text()


@pytest.mark.parametrize("out", [".", "notebooks"])
def test_release_refuses_to_overwrite_the_solutions(tmp_path, capsys, monkeypatch, out):
    project = tmp_path / "project"
    solutions = _solutions(project / "notebooks")
    before = (solutions / "09_x.ipynb").read_bytes()
    monkeypatch.chdir(project)
    assert main(["release", "--notebooks", "notebooks", "--out", out]) == 2
    assert "is or contains the solution folder" in capsys.readouterr().err
    assert (solutions / "09_x.ipynb").read_bytes() == before and sorted(os.listdir(solutions)) == ["09_x.ipynb"]


def test_release_touches_only_what_it_wrote(tmp_path):
    solutions, out = _solutions(tmp_path / "solutions"), tmp_path / "out"
    out.mkdir()
    (out / "05_mine.ipynb").write_text("{}")  # the instructor's own notebook, not a student copy
    (out / "notes.txt").write_text("keep me")
    release(solutions, out)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1", id="a")]), solutions / "08_y.ipynb")
    release(solutions, out)
    (solutions / "08_y.ipynb").unlink()
    release(solutions, out)  # 08's student copy is stale: release wrote it, so it goes
    assert sorted(os.listdir(out)) == ["05_mine.ipynb", "09_x.ipynb", "notes.txt"]
    (out / "09_x.ipynb").write_text("{}")  # replaced by something release did not write
    with pytest.raises(ReleaseError, match="did not write .*09_x.ipynb"):
        release(solutions, out)
    assert (out / "09_x.ipynb").read_text() == "{}"


# ----------------------------------------------------------------------------- the sandbox supervisor
DETACH = """
import os, subprocess, sys, time
daemon = '''
import os, time
if os.fork():
    os._exit(0)
with open(PID, "w") as f:
    f.write(str(os.getpid()))
time.sleep(300)
'''.replace("PID", repr(sys.argv[1]))
subprocess.Popen([sys.executable, "-c", daemon], start_new_session=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
"""


def test_the_supervisor_kills_what_detached_itself(tmp_path):
    """A double-forked, setsid daemon started under the supervisor is dead when the supervisor returns
    (without the supervisor's kill it is re-parented to init and lives on)."""
    pid_file, child = tmp_path / "daemon.pid", tmp_path / "child.py"
    child.write_text(DETACH)
    done = subprocess.run([sys.executable, "-m", "course.instructor.grading.sandbox", "--cpu", "60", "--memory", "4096",
                           "--files", "16", "--", sys.executable, str(child), str(pid_file)],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert done.returncode == 0 and pid_file.exists()
    pid = int(pid_file.read_text())
    alive = Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the detached daemon outlived its supervisor"


# ----------------------------------------------------------------------------- the instructor extra
@pytest.mark.parametrize("argv, missing", [
    (["grade", "class", "--key", "key.json"], "nbclient"), (["release", "--check"], "nbformat"), (["site"], "nbconvert"),
    (["check-outputs"], "nbformat"), (["bench", "--notebooks"], "papermill"),
])
def test_without_the_instructor_extra_each_tool_says_what_to_install(capsys, monkeypatch, argv, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # as if it were not installed
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{missing}" in err and 'pip install "attention-sinks-course[instructor]"' in err
