"""scripts/run-course.sh in a fresh copy of the repository, with stand-ins for setup, JupyterLab and
papermill: by default it opens a working copy of the student notebooks and leaves `git status` clean."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course.instructor.site_docs import page_of

ROOT = Path(__file__).resolve().parents[2]
STUDENT = sorted(p.name for p in (ROOT / "notebooks/student").glob("[0-9]*.ipynb"))

FAKE_JUPYTER = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$RECORD"
"""
FAKE_PAPERMILL = """#!/usr/bin/env bash
# papermill --log-level WARNING IN OUT -p FAST VALUE: records its arguments, writes IN as if it had run
echo "$@" >> "$RECORD"
echo "${COURSE_THREADS:-unset}" >> "$RECORD.threads"
python - "$3" "$4" <<'PY'
import sys, nbformat
nb = nbformat.read(sys.argv[1], as_version=4)
for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
    cell.execution_count = i + 1
nbformat.write(nb, sys.argv[2])
PY
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The repository's files (tracked and untracked, not ignored) committed in a new repository, with
    setup.sh replaced by a stand-in (committed too) and a .venv whose activate puts fakes on PATH."""
    repo = tmp_path_factory.mktemp("clone")
    files = git(ROOT, "ls-files", "-co", "--exclude-standard", "-z").split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    (repo / "scripts/setup.sh").write_text("echo '== setup (stand-in)'\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "fresh clone")
    fake_bin = tmp_path_factory.mktemp("bin")
    python = f'#!/usr/bin/env bash\nexec "{sys.executable}" "$@"\n'  # this interpreter, with its packages
    for name, text in [("jupyter", FAKE_JUPYTER), ("papermill", FAKE_PAPERMILL), ("python", python)]:
        (fake_bin / name).write_text(text)
        (fake_bin / name).chmod(0o755)
    (repo / ".venv/bin").mkdir(parents=True)
    (repo / ".venv/bin/activate").write_text(f'export PATH="{fake_bin}:$PATH" PYTHONPATH="{repo}"\n')
    return repo


def run(repo: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    record = repo.parent / f"{repo.name}-record.txt"
    record.unlink(missing_ok=True)
    env = {**os.environ, "RECORD": str(record)}
    env.pop("MY_NOTEBOOKS", None)
    proc = subprocess.run(["bash", "scripts/run-course.sh", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=120)
    return proc, record.read_text().splitlines() if record.exists() else []


def test_the_default_opens_a_working_copy_of_the_student_notebooks(clone):
    proc, argv = run(clone)
    assert proc.returncode == 0, proc.stderr
    assert argv[0] == "lab" and argv[-1] == "my-notebooks/"
    assert sorted(p.name for p in (clone / "my-notebooks").glob("*.ipynb")) == STUDENT
    for name in STUDENT:
        assert (clone / "my-notebooks" / name).read_bytes() == (clone / "notebooks/student" / name).read_bytes()
    assert git(clone, "status", "--porcelain") == ""


def test_a_students_work_is_never_overwritten(clone):
    run(clone)
    mine = clone / "my-notebooks" / STUDENT[0]
    mine.write_text("my work")
    (clone / "my-notebooks" / STUDENT[1]).unlink()
    proc, _ = run(clone)
    assert proc.returncode == 0, proc.stderr
    assert mine.read_text() == "my work"
    assert (clone / "my-notebooks" / STUDENT[1]).exists(), "a deleted notebook comes back from notebooks/student"
    assert git(clone, "status", "--porcelain") == ""


def test_instructor_opens_the_solutions(clone):
    proc, argv = run(clone, "--instructor")
    assert proc.returncode == 0, proc.stderr
    assert argv[0] == "lab" and argv[-1] == "notebooks/"


@pytest.mark.slow
def test_execute_runs_every_solution_and_prints_its_wall_time(clone):
    proc, calls = run(clone, "--execute", "--fast")
    assert proc.returncode == 0, proc.stderr
    solutions = sorted(p.name for p in (clone / "notebooks").glob("[0-9]*.ipynb"))
    assert [c.split()[2] for c in calls] == [f"notebooks/{n}" for n in solutions]
    assert all(c.endswith("-p FAST True") for c in calls)
    for name in solutions:
        assert f"== {name}: 0 min" in proc.stdout
    assert "all: 0 min" in proc.stdout and "no frozen progress bar" in proc.stdout
    assert git(clone, "status", "--porcelain") == ""


@pytest.mark.slow
@pytest.mark.parametrize(("args", "fast"), [([], "True"), (["--full"], "False")])
def test_site_executes_every_solution_then_builds_the_site(clone, args, fast):
    proc, calls = run(clone, "--site", *args)
    assert proc.returncode == 0, proc.stderr
    solutions = sorted(p.name for p in (clone / "notebooks").glob("[0-9]*.ipynb"))
    assert [c.split()[2] for c in calls] == [f"notebooks/{n}" for n in solutions]
    assert all(c.endswith(f"-p FAST {fast}") for c in calls)
    pages = sorted(p.name for p in (clone / "site").glob("*.html"))
    docs = {"docs.html", "benchmarks.html", "references.html", "reproductions.html"}  # written even when missing
    docs |= {page_of(f"docs/{p.name}") for p in (clone / "docs").glob("*.md")}  # one page per docs/*.md
    assert pages == sorted(["index.html", *docs] + [n.replace(".ipynb", ".html") for n in solutions])
    assert f"{len(pages)} pages in site/" in proc.stdout
    assert git(clone, "status", "--porcelain") == ""  # outputs/ and site/ are ignored


def test_jobs_run_every_solution_longest_first_on_one_thread_each(clone):
    """``--jobs 2``: two notebooks at once, in the order of docs/notebook-times.md's FAST table, longest first,
    each kernel on one torch thread (``COURSE_THREADS=1``), so two kernels never ask for more threads than cores."""
    from course.instructor.notebook_times import read_times

    threads = clone.parent / f"{clone.name}-record.txt.threads"
    threads.unlink(missing_ok=True)
    proc, calls = run(clone, "--execute", "--fast", "--jobs", "2")
    assert proc.returncode == 0, proc.stderr
    solutions = sorted(p.name for p in (clone / "notebooks").glob("[0-9]*.ipynb"))
    times = read_times(clone / "docs/notebook-times.md", fast=True)
    longest_first = sorted(solutions, key=lambda n: -times.get(n.removesuffix(".ipynb"), 0))
    assert f"{len(solutions)} notebooks, 2 at once, the longest first: " in proc.stdout
    assert proc.stdout.split("the longest first: ")[1].split("\n")[0].split() == [f"notebooks/{n}" for n in longest_first]
    assert sorted(c.split()[2] for c in calls) == [f"notebooks/{n}" for n in solutions]
    assert sorted((clone / "outputs").glob("[0-9]*.ipynb")) == [clone / "outputs" / n for n in solutions]
    for name in solutions:
        assert f"== {name}: 0 min" in proc.stdout
    assert "no frozen progress bar" in proc.stdout and git(clone, "status", "--porcelain") == ""
    assert threads.read_text().split() == ["1"] * len(solutions)


def test_a_failing_notebook_under_jobs_fails_the_run_and_is_named(clone):
    broken = clone / "notebooks" / "05_snapkv.ipynb"
    text = broken.read_text()
    try:
        broken.write_text("{ not json")
        proc, _ = run(clone, "--execute", "--fast", "--jobs", "2")
    finally:
        broken.write_text(text)
    assert proc.returncode == 1 and "failed: notebooks/05_snapkv.ipynb" in proc.stderr
    assert "== 05_snapkv.ipynb: FAILED" in proc.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--execute", "--jobs", "0"], "--jobs takes a number of notebooks at once, 1 to 99, got '0'"),
    (["--execute", "--jobs", "two"], "--jobs takes a number of notebooks at once, 1 to 99, got 'two'"),
    (["--execute", "--jobs"], "--jobs takes a number of notebooks at once, 1 to 99"),
    (["--jobs", "2"], "--jobs applies to --execute and --site only"),
    (["--fast"], "--fast applies to --execute only"),
    (["--student"], "unknown option '--student'"),
    (["--execute", "--instructor"], "--instructor, --execute and --site exclude each other"),
    (["--site", "--execute"], "--instructor, --execute and --site exclude each other"),
    (["--execute", "--full"], "--full applies to --site only"),
])
def test_bad_options_are_named_and_exit_2(clone, args, message):
    proc, argv = run(clone, *args)
    assert proc.returncode == 2 and message in proc.stderr and "--instructor, --execute [--fast]" in proc.stderr
    assert argv == []
