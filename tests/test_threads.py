"""Thread choice (course.threads): the rule, its override, and the measurements behind it."""

from __future__ import annotations

import os

import pytest
import torch

from course.threads import (
    MATMUL_SHAPES,
    bench_threads,
    busy_cores,
    choose_threads,
    competing_process,
    cpu_cores,
    share_of_cores,
    threads_table,
    use_threads,
)


@pytest.mark.parametrize(("cores", "busy", "threads"), [
    (2, 0.0, 2), (2, 0.3, 2), (2, 0.8, 1), (2, 1.0, 1), (2, 3.5, 1), (8, 2.2, 6), (1, 0.0, 1), (4, -0.1, 4),
])
def test_threads_are_the_free_cores_and_at_least_one(cores, busy, threads):
    assert choose_threads(cores, busy) == threads


def test_the_override_wins_and_bad_values_are_named():
    assert choose_threads(2, 2.0, "3") == 3
    assert choose_threads(2, 2.0, " ") == 1  # empty: not set
    for bad in ("0", "two", "-1", "1.5"):
        with pytest.raises(ValueError, match=f"COURSE_THREADS must be a positive integer .*got '{bad}'"):
            choose_threads(2, 0.0, bad)


@pytest.mark.parametrize(("processes", "cores", "threads"), [(1, 2, 2), (2, 2, 1), (3, 2, 1), (4, 16, 4), (3, 8, 2)])
def test_side_by_side_processes_share_the_cores(processes, cores, threads):
    assert share_of_cores(processes, cores) == threads
    with pytest.raises(ValueError, match="processes must be a positive integer, got 0"):
        share_of_cores(0, cores)


def test_each_test_worker_runs_on_its_share_of_the_cores():
    """scripts/test.sh runs pytest in workers (pytest-xdist); tests/conftest.py gives each its share."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = share_of_cores(workers)
    if workers > 1:
        assert torch.get_num_threads() == share and os.environ["OMP_NUM_THREADS"] == str(share)
    else:
        assert "PYTEST_XDIST_WORKER" not in os.environ


def test_use_threads_sets_torch(monkeypatch, capsys):
    before = torch.get_num_threads()
    monkeypatch.setenv("COURSE_THREADS", "1")
    try:
        assert use_threads() == 1 and torch.get_num_threads() == 1
        assert "torch threads: 1 (COURSE_THREADS=1)" in capsys.readouterr().out
    finally:
        torch.set_num_threads(before)


def test_a_competing_process_is_measured_and_leaves_torch_a_core_less(monkeypatch):
    monkeypatch.delenv("COURSE_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        with competing_process() as procs:
            busy = busy_cores(0.5)
            threads = use_threads(verbose=False)
            assert all(p.poll() is None for p in procs)
    finally:
        torch.set_num_threads(before)
    assert busy >= 0.7, f"one busy-loop process should keep about one core busy, measured {busy:.2f}"
    assert threads <= max(1, cpu_cores() - 1), f"{cpu_cores()} cores, one taken: got {threads} threads"
    assert all(p.poll() is not None for p in procs), "the competing process is stopped after the block"


def test_bench_threads_times_every_shape_for_each_thread_count():
    result = bench_threads(competing=False, reps=2)
    counts = result["thread_counts"]
    assert counts[0] == 1 and result["competing"] is None
    assert [r["shape"] for r in result["quiet"]] == [s[0] for s in MATMUL_SHAPES]
    assert all(r[f"{t}_threads_us"] > 0 for r in result["quiet"] for t in counts)
    table = threads_table(result).splitlines()
    assert len(table) == 2 + len(MATMUL_SHAPES) and table[0].startswith("| matmul | quiet, 1 thread (µs)")


def test_bench_threads_command_writes_the_report(tmp_path, monkeypatch, capsys):
    import course.threads
    from course.__main__ import main

    def small(competing: bool) -> dict:
        return bench_threads(competing, reps=2)

    monkeypatch.setattr(course.threads, "bench_threads", small)
    report = tmp_path / "threads.md"
    assert main(["bench", "--threads", "--competing", "--report", str(report)]) == 0
    text = report.read_text()
    assert "`python -m course bench --threads --competing`" in text and "competing, 1 thread (µs)" in text
    assert "| decode step, MLP" in text and "COURSE_THREADS=n" in text
    assert f"Saved: {report}" in capsys.readouterr().out
