#!/usr/bin/env bash
# Set up (see setup.sh) and check an instructor's install in a fresh venv (check-instructor-install.sh), then run
# the whole test suite: every solution notebook executed once, top to bottom, in FAST mode on SmolLM2-135M into
# outputs/ (papermill: an error or a failed assertion stops the run; the notebooks' scientific claims are asserted
# there); then the unit tests, the browser test of the course site built from outputs/, and a class graded for real
# (tests/instructor/test_class_grading.py): every student copy released for graded use, filled in as an honest student would
# and graded with `course grade --key --jobs 2`, which also executes every student copy end to end on
# gpt2-tiny-random (GPT-2's architecture at 4 layers and width 128, random weights: the GPT-2 code paths offline in
# seconds a notebook, its claims recorded, not asserted).
#
# Both pytest runs after the class spread their test files over up to 4 workers (pytest-xdist, a file at a time in
# each, tests/conftest.py giving each worker its share of the cores: on two cores, two workers at one torch thread
# each, about 1.6 times as fast as one process at two threads, whose threads mostly wait for each other).
#
# --quick: the contributor suite instead, every test not marked `slow` (no notebook or grading kernel, no training,
# no long run of the real model: a few minutes on two cores), after the same set-up and ruff; further arguments
# go to pytest. docs/testing.md says what each suite holds.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=
if [ "${1:-}" = --quick ]; then quick=1; shift; fi
phase() {  # the time of the phase that just ended, for the per-phase split at the end of the run
  phases+=("$1: $((SECONDS - phase_start)) s")
  phase_start=$SECONDS
}
phases=() phase_start=$SECONDS
bash scripts/setup.sh
phase "set-up"
# shellcheck disable=SC1091
. .venv/bin/activate
ruff check .  # pyflakes and pycodestyle, as pyproject.toml's [tool.ruff] sets them
cores=$(nproc)
workers=$(( cores < 4 ? cores : 4 ))  # pytest-xdist: one test file per worker at a time, each on its share of the cores
parallel=(-n "$workers" --dist loadfile)
if [ -n "$quick" ]; then
  COURSE_FAST=1 COURSE_AUTOFILL=1 COURSE_MODEL="${COURSE_MODEL:-smollm2-135m}" MPLBACKEND=Agg COURSE_PROGRESS=text \
    exec python -m pytest -p no:cacheprovider "${parallel[@]}" -m "not slow" --durations=10 tests "$@"
fi
bash scripts/check-instructor-install.sh  # an instructor's install from scratch: grade, release, site (about a minute)
phase "ruff and the instructor's install"
export COURSE_FAST=1 COURSE_AUTOFILL=1 COURSE_MODEL="${COURSE_MODEL:-smollm2-135m}" MPLBACKEND=Agg COURSE_PROGRESS=text
# the notebooks draw their figures inline (the site shows them): no MPLBACKEND for their kernels
env -u MPLBACKEND COURSE_SET_UP=1 bash scripts/run-course.sh --execute --fast
phase "the notebooks, FAST"
status=0
suite() {  # pytest with the slowest tests named; "no test selected" (exit 5) only fails a run without arguments
  local rc=0
  COURSE_EXECUTED=outputs python -m pytest -p no:cacheprovider --durations=15 "$@" || rc=$?
  if [ "$rc" = 5 ] && [ "$with_args" = 1 ]; then rc=0; fi
  if [ "$rc" != 0 ]; then status=$rc; fi
}
with_args=$(( $# > 0 ))
class=tests/instructor/test_class_grading.py
suite "$class" "$@"  # one process: the grader runs two kernels at once itself
phase "a class graded (every student copy executed and graded)"
suite "${parallel[@]}" --ignore="$class" tests "$@"
phase "the rest of pytest"
printf '== %s\n' "${phases[@]}"
exit "$status"
