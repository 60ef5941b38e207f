"""Running one submitted notebook in a kernel: every cell, past errors, within its limits.

``execute`` runs a notebook's code cells in a fresh kernel under the supervisor of
``course.instructor.grading.sandbox`` and, with an ``Isolation``, inside its walls, with the grading parameters
injected after its ``parameters`` cell (``FAST = True``, ``AUTOFILL = False``). A cell that raises does not stop
the run; a cell that runs longer than the per-cell timeout, or prints more than the output limit, is interrupted;
the whole notebook has an overall time limit. No output is kept: grades never come from it. ``Run`` says, cell
by cell of the submitted notebook, what happened (``describe`` names a cell for feedback).
"""

from __future__ import annotations

import asyncio
import logging
import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from time import monotonic

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from course.instructor.grading.isolation import Isolation
from course.instructor.grading.sandbox import Limits, SandboxedKernelManager, stop_sandbox

__all__ = ["CellOutcome", "Run", "execute", "describe", "INJECTED_PARAMETERS", "TIMEOUT_ENAME"]

INJECTED_PARAMETERS = "# Parameters injected by the autograder\nFAST = True\nAUTOFILL = False\n"
TIMEOUT_ENAME = "CellTimeout"
_LOG = logging.getLogger(__name__)  # nbclient's messages (timeouts, ...) stay off the console
_LOG.addHandler(logging.NullHandler())
_LOG.propagate = False


@dataclass
class CellOutcome:
    error: str | None = None  # "NameError: name 'x' is not defined"; None when the cell ran cleanly
    timed_out_after: int | None = None  # seconds, when the cell was interrupted


@dataclass
class Run:
    cells: dict[int, CellOutcome] = field(default_factory=dict)  # by index in the submitted notebook
    stopped: str | None = None  # why the run ended before the last cell


class _QuietClient(NotebookClient):
    """Keeps no outputs (grades never come from them) and interrupts a cell that prints too much."""

    output_limit: int = Limits().output_mb * 2**20
    printed: int = 0  # bytes of output of the current cell
    flooded: bool = False  # the current cell went over the limit and was interrupted

    def new_cell(self) -> None:
        self.printed, self.flooded = 0, False

    def output(self, outs, msg, display_id, cell_index):
        content = msg.get("content", {})
        self.printed += len(str(content.get("text", ""))) + len(str(content.get("data", "")))
        if self.printed > self.output_limit and not self.flooded:
            self.flooded = True
            asyncio.ensure_future(self.km.interrupt_kernel())
        return None


def _with_parameters(nb: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, list[int | None]]:
    """The notebook with the grading parameters injected after its ``parameters`` cell (or first), and
    for every cell its index in the submitted notebook (None for the injected one)."""
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    at = tagged[0] + 1 if tagged else 0
    origin: list[int | None] = list(range(len(nb.cells)))
    nb.cells.insert(at, nbformat.v4.new_code_cell(INJECTED_PARAMETERS))
    origin.insert(at, None)
    return nb, origin


def describe(nb: nbformat.NotebookNode, index: int) -> str:
    """'cell 7 (`first line …`)': where a cell is, for feedback (cells counted from 1, markdown included)."""
    first = next((line.strip() for line in nb.cells[index].source.splitlines() if line.strip()), "")
    return f"cell {index + 1} (`{first[:40]}{'…' if len(first) > 40 else ''}`)"


def execute(nb: nbformat.NotebookNode, workdir: Path, control: Path, env: dict[str, str], timeout: int,
             total_timeout: int, limits: Limits, isolation: Isolation | None) -> Run:
    """Run every code cell in a sandboxed kernel, past errors, each within ``timeout`` s and all within
    ``total_timeout`` s; when it ends, everything the kernel started is killed. The kernel's connection
    file and its channels (IPC transport: files, never TCP) go to ``control`` (removed with it, even when the
    run is interrupted). With ``isolation`` the kernel sees ``workdir`` and ``control`` and the read-only
    install, nothing else."""
    run_nb, origin = _with_parameters(nbformat.from_dict(nb))
    run = Run()
    reply: dict[str, dict] = {}

    def on_executed(cell, cell_index, execute_reply) -> None:
        reply["content"] = (execute_reply or {}).get("content", {})

    km = type("_Limited", (SandboxedKernelManager,), {"limits": limits, "isolation": isolation,
                                                       "writable": (workdir, control), "workdir": workdir})(
        kernel_name="python3", connection_file=str(control / "kernel.json"), transport="ipc",
        ip=str(control / "channel"))
    client = _QuietClient(run_nb, km=km, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True,
                          record_timing=False, shutdown_kernel="immediate", on_cell_executed=on_executed,
                          resources={"metadata": {"path": str(workdir)}}, log=_LOG)
    client.output_limit = limits.output_mb * 2**20
    deadline = monotonic() + total_timeout
    with client.setup_kernel(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        try:
            _run_cells(client, run_nb, nb, origin, run, reply, timeout, total_timeout, deadline, limits)
        finally:
            stop_sandbox(km)
    return run


def _run_cells(client: _QuietClient, run_nb: nbformat.NotebookNode, nb: nbformat.NotebookNode,
               origin: list[int | None], run: Run, reply: dict, timeout: int, total_timeout: int,
               deadline: float, limits: Limits) -> None:
    for index, cell in enumerate(run_nb.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        where = "the injected parameters" if origin[index] is None else describe(nb, origin[index])
        remaining = deadline - monotonic()
        if remaining <= 0:
            run.stopped = f"the notebook used up its overall time limit of {total_timeout} s before {where}"
            return
        limit = max(1, math.ceil(min(timeout, remaining)))
        client.timeout = limit
        client.error_on_timeout = {"ename": TIMEOUT_ENAME, "evalue": f"interrupted after {limit} s"}
        client.new_cell()
        reply.clear()
        try:
            client.execute_cell(cell, index)
        except DeadKernelError:
            run.stopped = (f"the kernel died in {where} (a crash, os._exit(), out of memory "
                           f"({limits.memory_mb} MB) or of CPU time ({limits.cpu_seconds} s)?)")
            return
        content = reply.get("content", {})
        outcome = CellOutcome()
        if client.flooded:
            outcome.error = f"OutputLimit: interrupted after printing more than {limits.output_mb} MB"
        elif content.get("status") == "error":
            outcome.error = f"{content.get('ename')}: {content.get('evalue')}"
            if content.get("ename") == TIMEOUT_ENAME:
                if limit < timeout:  # cut short by the overall limit, not by its own
                    run.stopped = f"the notebook used up its overall time limit of {total_timeout} s in {where}"
                    return
                outcome.timed_out_after = limit
        if origin[index] is not None:
            run.cells[origin[index]] = outcome
