"""The autograder against a class of hostile submissions: every attack scores what it deserves, every
other submission is unaffected, and no process outlives the grading run."""

from __future__ import annotations

import os
import time

import pytest

from course.instructor.grading.grade import Limits, grade
from course.instructor.grading.sandbox import descendants
from tests.instructor.grading_attacks import EXERCISES, build_class


@pytest.fixture(scope="module")
def attacked(tmp_path_factory, grading_key) -> dict:
    root = tmp_path_factory.mktemp("class")
    expected = build_class(root)
    before = set(descendants(os.getpid()))  # processes earlier tests left are not this grading's
    start = time.monotonic()
    rows = grade([root], timeout=15, total_timeout=120, limits=Limits(cpu_seconds=240, output_mb=10), key=grading_key)
    seconds = time.monotonic() - start
    by_student: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_student.setdefault(r["student"], {})[r["exercise"]] = r
    return {"rows": by_student, "expected": expected, "seconds": seconds, "before": before}


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
