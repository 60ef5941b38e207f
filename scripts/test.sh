#!/usr/bin/env bash
# Set up (see setup.sh) and check an instructor's install in a fresh venv (check-instructor-install.sh), then run
# the whole test suite: every solution notebook executed once, top to bottom, in FAST mode on SmolLM2-135M into
# outputs/ (papermill: an error or a failed assertion stops the run; the notebooks' scientific claims are asserted
# there); then the unit tests, the browser test of the course site built from outputs/, and a class graded for real
# (tests/instructor/test_class_grading.py): every student copy released for graded use, filled in as an honest student would
# and graded with `course grade --key --jobs 2`, which also executes every student copy end to end on gpt2-random
# (GPT-2's architecture and shapes, random weights: the GPT-2 code paths offline, its claims recorded, not asserted).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
ruff check .  # pyflakes and pycodestyle, as pyproject.toml's [tool.ruff] sets them
bash scripts/check-instructor-install.sh  # an instructor's install from scratch: grade, release, site (about a minute)
export COURSE_FAST=1 COURSE_AUTOFILL=1 COURSE_MODEL="${COURSE_MODEL:-smollm2-135m}" MPLBACKEND=Agg COURSE_PROGRESS=text
# the notebooks draw their figures inline (the site shows them): no MPLBACKEND for their kernels
env -u MPLBACKEND COURSE_SET_UP=1 bash scripts/run-course.sh --execute --fast --jobs 2  # two at once, a thread each
COURSE_EXECUTED=outputs python -m pytest -p no:cacheprovider --durations=15 tests "$@"  # the slowest tests, named
