"""The autograder against a class of hostile submissions: every attack scores what it deserves, every
other submission is unaffected, and no process outlives the grading run."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time

import pytest

from course.instructor.grading.grade import Limits, grade
from course.instructor.grading.sandbox import descendants
from tests.instructor.grading_attacks import BURGLED, EXERCISES, build_class

pytestmark = pytest.mark.slow  # kernels, notebooks or the real model at length: not in the contributor suite


class _Listener:
    """A TCP server on the loopback that counts who connects (no kernel should reach it)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port, self.connections, self.stop = self.sock.getsockname()[1], 0, threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


@pytest.fixture(scope="module")
def attacked(tmp_path_factory, grading_key) -> dict:
    root = tmp_path_factory.mktemp("class")
    outside = tmp_path_factory.mktemp("outside")
    listener = _Listener()
    expected = build_class(root, grading_key, outside, listener.port)
    victim = root / "i_victim" / "01_kv_cache.ipynb"
    victim_before = hashlib.sha256(victim.read_bytes()).hexdigest()
    before = set(descendants(os.getpid()))  # processes earlier tests left are not this grading's
    start = time.monotonic()
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("HF_TOKEN", "hf_secret_of_the_instructor")  # a hub token the instructor happens to have set
            env.setenv("AWS_SECRET_ACCESS_KEY", "hf_secret_too")
            rows = grade([root], timeout=15, total_timeout=120, limits=Limits(cpu_seconds=240, output_mb=10),
                         key=grading_key, jobs=2, threads=1)
    finally:
        listener.close()
    seconds = time.monotonic() - start
    by_student: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_student.setdefault(r["student"], {})[r["exercise"]] = r
    return {"rows": by_student, "expected": expected, "seconds": seconds, "before": before, "outside": outside,
            "connections": listener.connections,
            "victim_unchanged": hashlib.sha256(victim.read_bytes()).hexdigest() == victim_before}


def test_every_submission_gets_the_points_it_deserves(attacked):
    got = {s: sum(r["points"] for r in rows.values()) for s, rows in attacked["rows"].items()}
    assert got == attacked["expected"], {s: {e: (r["status"], r["feedback"][:120]) for e, r in rows.items()}
                                         for s, rows in attacked["rows"].items()}


def test_patching_the_checker_in_the_kernel_changes_nothing(attacked):
    rows = attacked["rows"]["b_patcher"]
    assert all(r["status"] == "not_done" for r in rows.values()), rows


def test_forged_records_are_not_read(attacked):
    rows = attacked["rows"]["c_forger"]
    assert all(r["status"] == "not_done" for r in rows.values()), rows


@pytest.mark.parametrize("student", ["d_forwarder", "e_quiet_forwarder"])
def test_forwarding_to_the_course_is_reported(attacked, student):
    rows = attacked["rows"][student]
    assert all(rows[e]["status"] == "forwarded" and "the course's own implementation" in rows[e]["feedback"]
               for e in EXERCISES), rows


def test_a_detached_process_neither_survives_nor_reaches_the_next_submission(attacked):
    saboteur = attacked["rows"]["f_saboteur"]
    assert {r["cells_failed"] for r in saboteur.values()} == {""}, "the saboteur's daemon never started"
    assert all(r["status"] == "pass" for r in attacked["rows"]["i_victim"].values())
    assert all(r["status"] == "review" and "COURSE_GRADER_SOCKET" in r["feedback"] for r in saboteur.values())


def test_no_process_is_left_behind(attacked):
    """Grading the attacks (a daemon, fork bombs, endless kernels) leaves no process of its own behind."""
    assert set(descendants(os.getpid())) - attacked["before"] == set()


def test_a_kernel_that_never_ends_is_stopped_and_keeps_its_grades(attacked):
    assert all(r["status"] == "pass" for r in attacked["rows"]["g_never_ends"].values())


def test_flooding_output_is_cut_off(attacked):
    assert all(r["status"] == "pass" for r in attacked["rows"]["h_flooder"].values())
    assert attacked["seconds"] < 9 * 60, f"grading the class took {attacked['seconds']:.0f} s"


def test_the_burglar_finds_nothing_and_changes_nothing(attacked):
    """The key (at its own path and through /proc), a token in the grader's environment, the other submissions and
    kernels, the network, a folder outside its own: each attack guards one exercise, which passes only if the attack
    got through. None does; the victim keeps every point and its file is untouched."""
    rows = attacked["rows"]["p_burglar"]
    leaked = {e: (rows[e]["status"], rows[e]["feedback"][:100]) for e in BURGLED if rows[e]["points"]}
    assert not leaked, leaked
    assert rows["01.greedy_own_attention"]["status"] == "pass"  # the one exercise without an attack still counts
    assert attacked["victim_unchanged"]
    assert attacked["connections"] == 0
    assert sorted(p.name for p in attacked["outside"].iterdir()) == []
    assert {r["isolation"] for rs in attacked["rows"].values() for r in rs.values()} == {"bubblewrap"}


def test_a_watch_switched_off_in_the_kernel_still_refuses_the_forwarding(attacked):
    """The kernel's own watch is blinded (by a route the scan of the source does not name), so the kernel passes the
    three forwarded exercises; the second check, where the course is absent, refuses them."""
    rows = attacked["rows"]["q_blind_forwarder"]
    assert all(rows[e]["status"] == "forwarded" for e in EXERCISES), {e: rows[e]["status"] for e in EXERCISES}
