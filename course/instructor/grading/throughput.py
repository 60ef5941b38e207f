"""Grading throughput: submissions per minute and CPU time per submission against ``--jobs``, and a class's bill.

``python -m course bench --grading [--copies 8] [--jobs 1 2] [--submission NB...]`` grades the same class once
per ``--jobs`` value: ``copies`` submissions, copies of the given notebooks in turn (by default notebook 01's
solution and its blank student copy, which the grader runs to the end with the reference solutions), each run
into a fresh gradebook, one after the other. For each it measures the wall time, the CPU time of the grader and
everything it started (kernels, grading processes: ``getrusage``), and the memory of all of them together
(their resident sets summed, sampled every half second), and checks that every run wrote the same gradebook.

The projection for a class multiplies notebook 01's measured CPU time per submission, at one thread per kernel,
by each notebook's wall time relative to notebook 01's (``docs/notebook-times.md``): it assumes that each notebook
costs CPU in proportion to its wall time, and that kernels with one thread each scale to every core of a larger
machine. The report replaces the block between two markers in ``docs/grading.md``.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from course.instructor.grading.gradebook import Gradebook
from course.instructor.grading.grade import grade
from course.instructor.grading.sandbox import descendants
from course.threads import cpu_cores, share_of_cores

__all__ = ["BEGIN", "END", "measure_grading", "project_class", "grading_report", "write_report"]

BEGIN, END = "<!-- grading-throughput:begin -->", "<!-- grading-throughput:end -->"


def _cpu_seconds() -> float:
    """CPU time (user + system) of this process and of every descendant it has waited for."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:")), 0.0)
    except OSError:
        return 0.0


class _PeakMemory:
    """The largest sum of resident sets of this process and all its descendants, sampled every ``every`` s."""

    def __init__(self, every: float = 0.5) -> None:
        self.every, self.peak_mb = every, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = os.getpid()
        while not self._stop.wait(self.every):
            self.peak_mb = max(self.peak_mb, sum(_rss_mb(p) for p in [me, *descendants(me)]))

    def __enter__(self) -> _PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _class_folder(folder: Path, submissions: list[Path], copies: int) -> Path:
    """``copies`` students, student ``i`` handing in a copy of ``submissions[i % len(submissions)]``."""
    shutil.rmtree(folder, ignore_errors=True)
    for i in range(copies):
        source = submissions[i % len(submissions)]
        (folder / f"student-{i:03d}").mkdir(parents=True)
        shutil.copyfile(source, folder / f"student-{i:03d}" / source.name)
    return folder


def measure_grading(submissions: list[Path], copies: int, jobs: list[int], work: Path, key: Path, timeout: int = 300,
                    progress: bool = True) -> dict:
    """Grade ``copies`` submissions once per value of ``jobs`` (each kernel with cores // jobs threads), with the
    grading ``key`` of the release they were made from."""
    if copies < 1:
        raise ValueError(f"--copies must be at least 1, got {copies}")
    for path in submissions:
        if not path.is_file():
            raise ValueError(f"--submission {path} is not a file")
    cores = cpu_cores()
    class_dir = _class_folder(work / "class", submissions, copies)
    runs, books = [], []
    for j in jobs:
        threads = share_of_cores(j, cores)
        book = Gradebook(work / f"jobs-{j}", regrade=True)
        cpu0, start = _cpu_seconds(), time.perf_counter()
        with _PeakMemory() as memory:
            rows = grade([class_dir], timeout, gradebook=book, jobs=j, threads=threads, key=key)
        wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu0
        runs.append({"jobs": j, "threads": threads, "submissions": copies, "wall_s": wall,
                     "per_minute": 60 * copies / wall, "cpu_s_per_submission": cpu / copies,
                     "peak_memory_mb": memory.peak_mb, "statuses": dict(Counter(r["status"] for r in rows))})
        books.append(book.json_path.read_bytes())
        if progress:
            print(f"--jobs {j}: {copies} submissions in {wall:.0f} s ({60 * copies / wall:.2f} per minute), "
                  f"{cpu / copies:.1f} CPU s each, {memory.peak_mb:.0f} MB at most", flush=True)
    return {"machine": f"{platform.machine()}, {cores} cores", "date": f"{datetime.now(timezone.utc):%Y-%m-%d}",
            "submissions": [str(p) for p in submissions], "copies": copies, "runs": runs,
            "same_gradebook": all(b == books[0] for b in books)}


def project_class(result: dict, times: dict[str, float], students: int = 200, cores: int = 32) -> dict:
    """What grading ``students`` x every notebook of ``times`` costs on ``cores`` cores, one thread per kernel,
    from the measured run with the fewest threads (see the module's docstring for the assumptions)."""
    run = min(result["runs"], key=lambda r: r["threads"])
    graded = [Path(result["submissions"][i % len(result["submissions"])]).stem for i in range(result["copies"])]
    unknown = sorted(set(graded) - set(times))
    if unknown:
        raise ValueError(f"no wall time of {', '.join(unknown)} in the notebook times: the projection scales by them")
    base_wall = sum(times[name] for name in graded) / len(graded)  # the graded mix's mean FAST wall time
    per_wall = run["cpu_s_per_submission"] / base_wall  # CPU seconds graded per second of FAST wall time
    cpu = {name: per_wall * wall for name, wall in times.items()}
    total = students * sum(cpu.values())
    memory_per_job = run["peak_memory_mb"] / run["jobs"]
    return {"students": students, "notebooks": len(times), "cores": cores, "threads": run["threads"],
            "cpu_s": cpu, "total_cpu_h": total / 3600, "wall_h": total / cores / 3600,
            "memory_gb": cores * memory_per_job / 1024, "memory_per_job_mb": memory_per_job,
            "base": ", ".join(sorted(set(graded)))}


def grading_report(result: dict, projection: dict, command: str) -> str:
    """The measurement and the projection as markdown (what goes between the markers)."""
    lines = [f"Measured by `{command}` on {result['machine']} ({result['date']}): {result['copies']} submissions "
             f"(copies of {', '.join(f'`{s}`' for s in result['submissions'])} in turn), graded once per `--jobs` "
             "value into a fresh gradebook; CPU time is the grader's and everything it started; memory is the "
             "largest sum of the resident sets of all of them. "
             + ("Every run wrote the same gradebook." if result["same_gradebook"] else
                "**The runs wrote different gradebooks.**"), "",
             "| --jobs | threads per kernel | wall time | submissions per minute | CPU s per submission | "
             "peak memory | statuses |", "|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))
        lines.append(f"| {r['jobs']} | {r['threads']} | {r['wall_s']:.0f} s | {r['per_minute']:.2f} | "
                     f"{r['cpu_s_per_submission']:.1f} | {r['peak_memory_mb'] / 1024:.1f} GB | {statuses} |")
    p = projection
    lines += ["", f"**A class of {p['students']} students x {p['notebooks']} notebooks on {p['cores']} cores** "
              f"(`--jobs {p['cores']}`, one thread per kernel): each notebook's CPU time per submission is "
              f"{p['base']}'s measured one ({p['threads']} thread) scaled by its FAST wall time in "
              "[notebook-times.md](notebook-times.md):", "",
              "| notebook | CPU s per submission (estimated) |", "|---|---|"]
    lines += [f"| {name} | {seconds:.0f} |" for name, seconds in p["cpu_s"].items()]
    lines += ["", f"{p['students'] * p['notebooks']} submissions, {p['total_cpu_h']:.1f} CPU hours: about "
              f"**{p['wall_h']:.1f} h** on {p['cores']} cores if kernels with one thread each keep every core "
              f"busy (memory bandwidth and a busy machine are not modelled), with about "
              f"{p['memory_gb']:.0f} GB of memory ({p['memory_per_job_mb'] / 1024:.1f} GB per job measured here; "
              "each kernel may use up to `--memory` MB of address space)."]
    return "\n".join(lines)


def write_report(path: Path, text: str, begin: str = BEGIN, end: str = END) -> Path:
    """Put ``text`` between the markers ``begin`` and ``end`` in ``path`` (appended, with the markers, when they
    are not there)."""
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    block = f"{begin}\n{text}\n{end}"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + ("\n\n" if old else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new, encoding="utf-8")
    return path
