"""Each submission's kernel runs under a small supervisor that owns everything the kernel starts.

``python -m course.instructor.grading.sandbox --cpu S --memory MB --files MB -- KERNEL COMMAND...`` (Linux):

* starts a new session, and becomes a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): a process
  the kernel starts that detaches itself (double fork, ``setsid``) is re-parented to the supervisor,
  not to init, so it can always be found;
* sets resource limits inherited by everything below it: CPU seconds per process (``RLIMIT_CPU``),
  address space (``RLIMIT_AS``), size of any file written (``RLIMIT_FSIZE``), no core dumps;
* runs the kernel; when the kernel exits, or the grader sends SIGTERM, or the grader dies
  (``PR_SET_PDEATHSIG``), it kills every process below it (repeatedly, until none is left) and exits.

SIGINT is ignored by the supervisor: the kernel manager sends interrupts to the whole process group.
``SandboxedKernelManager`` is the Jupyter kernel manager that starts kernels this way;
``stop_sandbox`` asks the supervisor to clean up before the kernel manager shuts the kernel down.
These limits protect the grading run; the wall that keeps grading material out of the kernel's world is
``course.instructor.grading.isolation`` (bubblewrap), which the supervisor starts the kernel in.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from jupyter_client import AsyncKernelManager

from course.instructor.grading.isolation import Isolation

__all__ = ["Limits", "SandboxedKernelManager", "stop_sandbox", "descendants", "main"]

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


@dataclass(frozen=True)
class Limits:
    """Resource limits of one submission's kernel and of everything it starts."""

    cpu_seconds: int = 3600  # per process
    memory_mb: int = 8192  # address space per process
    file_mb: int = 256  # largest file it may write
    output_mb: int = 10  # printed output the grader accepts per cell before interrupting it

    def args(self) -> list[str]:
        return ["--cpu", str(self.cpu_seconds), "--memory", str(self.memory_mb), "--files", str(self.file_mb)]


def _children_by_parent() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``)."""
    tree, found, todo = _children_by_parent(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_everything_below(rounds: int = 100) -> None:
    """SIGKILL every descendant of this process until none is left (new ones are orphans of killed ones)."""
    for _ in range(rounds):
        pids = descendants(os.getpid())
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
        _reap()


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop()


def _set_limits(cpu: int, memory_mb: int, file_mb: int) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb * 2**20, file_mb * 2**20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m course.instructor.grading.sandbox")
    p.add_argument("--cpu", type=int, required=True)
    p.add_argument("--memory", type=int, required=True)
    p.add_argument("--files", type=int, required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command to run after --")
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("sandbox: this system cannot make the supervisor a subreaper (Linux 3.4+ needed)", file=sys.stderr)
        return 70
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    signal.signal(signal.SIGTERM, _raise_stop)
    if os.getppid() != parent:  # the grader died before the death signal was armed
        return 0
    try:
        os.setsid()
    except PermissionError:
        pass  # already a session leader
    _set_limits(args.cpu, args.memory, args.files)
    code = 0
    try:
        kernel = subprocess.Popen(command)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are for the kernel
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == kernel.pid:
                code = os.waitstatus_to_exitcode(status)
                break
    except _Stop:
        code = 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        kill_everything_below()
    return code if code >= 0 else 128 - code


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernels run under the sandbox supervisor with ``limits`` and, with ``isolation``,
    inside its walls (seeing only the ``writable`` folders besides the read-only ones, working in ``workdir``)."""

    limits: Limits = Limits()
    isolation: Isolation | None = None
    writable: tuple[Path, ...] = ()
    workdir: Path | None = None

    @property
    def kernel_spec(self):  # type: ignore[override]
        spec = super().kernel_spec
        if spec is not None and self.isolation is not None:
            # a signal to the kernel's process group would reach bwrap outside the walls, not the kernel inside:
            # interrupts go as a message on the control channel, which the kernel turns into its own SIGINT
            spec.interrupt_mode = "message"
        return spec

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        if self.isolation is not None:
            cmd = self.isolation.command(cmd, list(self.writable), self.workdir or self.writable[0])
        return [sys.executable, "-m", "course.instructor.grading.sandbox", *self.limits.args(), "--", *cmd]


def stop_sandbox(km: AsyncKernelManager, wait: float = 10.0) -> None:
    """Ask the supervisor of ``km``'s kernel to kill everything below it, and wait until it has."""
    process = getattr(getattr(km, "provisioner", None), "process", None)
    if process is None or process.poll() is not None:
        return
    try:
        process.send_signal(signal.SIGTERM)
        process.wait(wait)
    except (OSError, subprocess.TimeoutExpired):
        process.kill()  # the supervisor itself is stuck: its processes fall to init, and the run says so


if __name__ == "__main__":
    sys.exit(main())
