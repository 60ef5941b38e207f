"""The grading sandbox (``course.instructor.grading.isolation``): what a walled process sees, the refusal where walls
cannot be built, and ``--no-sandbox`` recorded on every row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course.__main__ import main
from course.instructor.grading import isolation as iso
from course.instructor.grading.isolation import IsolationUnavailable, find_isolation, kernel_env
from tests.instructor.grading_helpers import CHECK, GOOD, tiny

PROBE = """
import json, os, socket
seen = {"proc": sorted(p for p in os.listdir("/proc") if p.isdigit()), "root": sorted(os.listdir("/")),
        "env": sorted(os.environ), "home_of_grader": sorted(os.listdir(%r)) if os.path.isdir(%r) else [],
        "key": os.path.exists(%r)}
try:
    socket.create_connection(("1.1.1.1", 53), timeout=1)
    seen["network"] = True
except OSError:
    seen["network"] = False
import course
seen["course"] = course.__file__
seen["beside_course"] = sorted(os.listdir(os.path.dirname(os.path.dirname(course.__file__))))
print(json.dumps(seen))
"""


def test_a_walled_process_sees_only_its_folder_and_the_install(tmp_path, monkeypatch):
    walls = find_isolation()
    key = tmp_path / "secret" / "key.json"
    key.parent.mkdir()
    key.write_text("{}")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    home = str(Path.home())
    command = walls.command([sys.executable, "-c", PROBE % (home, home, str(key))], [scratch], scratch)
    done = subprocess.run(command, env=kernel_env(scratch, {}), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert len(seen["proc"]) <= 3  # the sandbox's init and this process (and its own children)
    assert not seen["key"] and not seen["network"]
    assert "HF_TOKEN" not in seen["env"]
    system = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev", "tmp"}
    assert set(seen["root"]) <= system | {p.parts[1] for p in walls.read_only}, seen["root"]
    bound = {p.relative_to(Path.home()).parts[0] for p in walls.read_only if p.is_relative_to(Path.home())}
    assert set(seen["home_of_grader"]) <= bound  # of your HOME, only what holds the install or its caches
    import course

    assert seen["course"] == course.__file__
    assert "notebooks" not in seen["beside_course"]  # the package alone, never the repository around it


def test_grade_refuses_in_one_line_where_walls_cannot_be_built(tmp_path, monkeypatch, capsys, grading_key):
    """A system without unprivileged user namespaces: bwrap fails as it does there; nothing is written."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace, likely because the kernel "
                    "does not allow non-privileged user namespaces.' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(iso, "bwrap_binary", lambda: fake)
    submission = tiny(tmp_path / "class" / "ada" / "01_kv_cache.ipynb", "AUTOFILL = False", GOOD, CHECK)
    assert main(["grade", str(submission.parent.parent), "--key", str(grading_key), "--out",
                 str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "user namespaces" in err and "--no-sandbox" in err, err
    assert not (tmp_path / "out").exists()


def test_a_key_the_kernels_could_read_is_refused(tmp_path):
    walls = find_isolation()
    inside = walls.read_only[-1] / "grading-key.json"
    with pytest.raises(IsolationUnavailable, match="every graded kernel can read"):
        walls.check_absent("the grading key", inside)
    walls.check_absent("the grading key", tmp_path / "key.json")  # anywhere else is fine


@pytest.mark.slow
def test_without_the_sandbox_every_row_says_so_and_the_environment_is_still_an_allow_list(tmp_path, monkeypatch,
                                                                                        grading_key):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    leak = ("import os\nassert 'HF_TOKEN' not in os.environ and os.environ['HOME'] != " + repr(os.environ["HOME"]))
    submission = tiny(tmp_path / "class" / "ada" / "01_kv_cache.ipynb", "AUTOFILL = False", leak, GOOD, CHECK)
    assert main(["grade", str(submission.parent.parent), "--key", str(grading_key), "--out", str(tmp_path / "out"),
                 "--no-sandbox", "--no-similarity", "--jobs", "1"]) == 0
    rows = json.loads((tmp_path / "out" / "gradebook.json").read_text())
    assert {r["isolation"] for r in rows} == {"none (--no-sandbox)"}
    assert {r["cells_failed"] for r in rows} == {""}, rows[0]["cells_failed"]
    assert [r["status"] for r in rows if r["exercise"] == "01.kv_cache_bytes"] == ["pass"]


def test_socket_folder_leaves_room_for_the_sockets_under_a_long_tmpdir(tmp_path, monkeypatch, short_tmpdir):
    """An instructor's TMPDIR may be long (a CI runner's, a build folder's): the grader's sockets still bind."""
    import socket
    import tempfile

    from course.instructor.grading.remote import SOCKET_PATH_MAX, socket_folder

    for base, expected in ((short_tmpdir, short_tmpdir), (tmp_path / ("t" * 60), Path("/tmp"))):
        base.mkdir(exist_ok=True)
        monkeypatch.setattr(tempfile, "tempdir", str(base))
        with socket_folder("course-grade-") as folder:
            path = Path(folder) / "control" / "grader.sock"
            assert Path(folder).parent == expected and len(str(path)) <= SOCKET_PATH_MAX
            path.parent.mkdir()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
                listener.bind(str(path))
        assert not Path(folder).exists()


def test_no_room_for_the_sockets_is_one_line_before_anything_is_graded(tmp_path, monkeypatch, grading_key, capsys):
    """TMPDIR too long and no short folder to fall back on: `course grade` says so once and writes nothing (it used
    to grade every submission "error")."""
    import tempfile

    from course.__main__ import main
    from course.instructor.grading import remote

    long = tmp_path / ("t" * 90)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    monkeypatch.setattr(remote, "SHORT_TMP", str(long))
    tiny(tmp_path / "class" / "ada" / "01_kv_cache.ipynb", "AUTOFILL = False", GOOD, CHECK)
    out = tmp_path / "out"
    assert main(["grade", str(tmp_path / "class"), "--key", str(grading_key), "--out", str(out), "--no-sandbox"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "TMPDIR=" in err and "too long for the grader's sockets" in err, err
    assert not out.exists() and list(long.iterdir()) == []


@pytest.mark.slow
def test_a_long_tmpdir_grades_as_a_short_one(tmp_path, grading_key):
    scratch = tmp_path / ("t" * 80)
    scratch.mkdir()
    submission = tiny(tmp_path / "class" / "ada" / "01_kv_cache.ipynb", "AUTOFILL = False", GOOD, CHECK)
    done = subprocess.run([sys.executable, "-m", "course", "grade", str(submission.parent.parent), "--key",
                           str(grading_key), "--out", str(tmp_path / "out"), "--no-similarity", "--jobs", "1"],
                          env={**os.environ, "TMPDIR": str(scratch)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "out" / "gradebook.json").read_text())
    assert [(r["status"], r["cells_failed"]) for r in rows if r["exercise"] == "01.kv_cache_bytes"] == [("pass", "")]
    assert list(scratch.iterdir()) == []  # nothing left behind in the instructor's TMPDIR
