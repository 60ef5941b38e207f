"""How many threads torch should use here, and the measurement behind the rule.

The course's matrices are small (a 135M model decoding one token, tiny models in training). For
them a second thread helps a little on an idle machine and hurts a lot on a busy one: torch's
worker threads wait for each other at every operation, and a thread that has to share its core
with another process makes every operation wait for it. So the rule is to use the cores that are
free now: ``choose_threads(cores, busy)``, with ``busy`` the cores other processes keep busy,
measured over a fraction of a second (``busy_cores``). ``COURSE_THREADS`` overrides it.

``python -m course bench --threads [--competing]`` measures the rule's premise: matmuls of the
course's shapes with 1 thread and with every core, on a quiet machine and next to one CPU-bound
process (``competing_process``).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["THREADS_ENV", "cpu_cores", "busy_cores", "choose_threads", "share_of_cores", "use_threads",
           "competing_process",
           "MATMUL_SHAPES", "matmul_seconds", "bench_threads", "threads_table", "threads_report"]

THREADS_ENV = "COURSE_THREADS"

# (name, batch, m, k, n): matmuls of the course's models (SmolLM2-135M: width 576, MLP 1536, 9 heads of 64)
MATMUL_SHAPES: tuple[tuple[str, int, int, int, int], ...] = (
    ("decode step, MLP (1x576 @ 576x1536)", 1, 1, 576, 1536),
    ("prompt chunk, projection (256x576 @ 576x576)", 1, 256, 576, 576),
    ("attention scores (9 heads, 256x64 @ 64x256)", 9, 256, 64, 256),
    ("tiny model training (2048x64 @ 64x256)", 1, 2048, 64, 256),
)


def cpu_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat (Linux); None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def busy_cores(interval: float = 0.5) -> float:
    """How many cores are busy right now: the machine's CPU use over ``interval`` seconds (Linux),
    else the one-minute load average. Call it while this process is idle."""
    before = _cpu_times()
    if before is None:
        return float(os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0.0
    time.sleep(interval)
    after = _cpu_times()
    busy, total = after[0] - before[0], after[1] - before[1]
    return (os.cpu_count() or 1) * busy / total if total > 0 else 0.0


def choose_threads(cores: int, busy: float, override: str | None = None) -> int:
    """Threads for torch: ``override`` (a positive integer, from ``COURSE_THREADS``) if given, else the
    cores that are free (``cores - busy``, rounded), at least 1."""
    if override is not None and override.strip():
        text = override.strip()
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{THREADS_ENV} must be a positive integer (threads for torch), got {override!r}")
        return int(text)
    if cores < 1:
        raise ValueError(f"cores must be a positive integer, got {cores}")
    return max(1, min(cores, round(cores - max(0.0, busy))))


def share_of_cores(processes: int, cores: int | None = None) -> int:
    """Threads for each of ``processes`` processes running side by side (test workers, kernels): an equal share of
    ``cores`` (default: this process's), at least 1, so that together they never ask for more threads than cores."""
    if processes < 1:
        raise ValueError(f"processes must be a positive integer, got {processes}")
    return max(1, (cpu_cores() if cores is None else cores) // processes)


def use_threads(verbose: bool = True) -> int:
    """Set torch's thread count by ``choose_threads`` (measuring the machine for half a second unless
    ``COURSE_THREADS`` is set) and return it."""
    override = os.environ.get(THREADS_ENV)
    cores = cpu_cores()
    busy = 0.0 if override else busy_cores()
    n = choose_threads(cores, busy, override)
    torch.set_num_threads(n)
    if verbose:
        why = f"{THREADS_ENV}={override}" if override else f"{cores} cores, {busy:.1f} busy"
        print(f"torch threads: {n} ({why})")
    return n


@contextmanager
def competing_process(count: int = 1) -> Iterator[list[subprocess.Popen]]:
    """``count`` CPU-bound processes (a Python busy loop each) running while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5)  # let them start spinning
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


@torch.inference_mode()
def matmul_seconds(shape: tuple[int, int, int, int], threads: int, reps: int = 30, inner: int = 20) -> float:
    """Median seconds of one matmul of ``shape`` (batch, m, k, n) with ``threads`` torch threads."""
    batch, m, k, n = shape
    a, b = torch.randn(batch, m, k), torch.randn(batch, k, n)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.matmul(a, b)  # warm up
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            for _ in range(inner):
                torch.matmul(a, b)
            times.append((time.perf_counter() - start) / inner)
    finally:
        torch.set_num_threads(previous)
    return statistics.median(times)


def _one_pass(thread_counts: tuple[int, ...], reps: int) -> list[dict]:
    rows = []
    for name, *shape in MATMUL_SHAPES:
        row = {"shape": name}
        for t in thread_counts:
            row[f"{t}_threads_us"] = 1e6 * matmul_seconds(tuple(shape), t, reps)
        rows.append(row)
    return rows


def bench_threads(competing: bool = True, reps: int = 30) -> dict:
    """Matmuls of the course's shapes with 1 thread and with every core, quiet and (``competing``) next
    to one CPU-bound process. Returns {"cores", "busy_before", "quiet": rows, "competing": rows | None}."""
    counts = tuple(sorted({1, cpu_cores()}))
    result = {"cores": cpu_cores(), "busy_before": round(busy_cores(), 2), "thread_counts": list(counts),
              "quiet": _one_pass(counts, reps), "competing": None}
    if competing:
        with competing_process():
            result["competing"] = _one_pass(counts, reps)
    return result


def threads_table(result: dict) -> str:
    """The micro-benchmark as a markdown table: microseconds per matmul."""
    counts = result["thread_counts"]
    runs = [("quiet", result["quiet"])] + ([("competing", result["competing"])] if result["competing"] else [])
    head = ["matmul"] + [f"{run}, {t} thread{'s' * (t > 1)} (µs)" for run, _ in runs for t in counts]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, row in enumerate(result["quiet"]):
        cells = [row["shape"]] + [f"{rows[i][f'{t}_threads_us']:.0f}" for _, rows in runs for t in counts]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def threads_report(result: dict) -> str:
    """The micro-benchmark as a markdown page: how it was measured, the table, and the rule it supports."""
    competing = " --competing" if result["competing"] else ""
    return (
        "# Threads for small matmuls\n\n"
        f"Measured by `python -m course bench --threads{competing}` on {result['cores']} cores "
        f"({result['busy_before']} cores busy just before it started): median microseconds per matmul of "
        "the course's shapes, with 1 thread and with every core"
        + (", on the machine as it was and next to one CPU-bound process (a Python busy loop)" if competing else "")
        + ".\n\n" + threads_table(result) + "\n\n"
        "The notebooks call `course.threads.use_threads()`: torch gets the cores that are free when it runs "
        f"(at least one); `{THREADS_ENV}=n` overrides it.\n"
    )
