#!/usr/bin/env bash
# Set up (see setup.sh), then run the whole test suite: unit tests, and every notebook executed
# top to bottom in FAST mode (solution copies, and student copies with AUTOFILL).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export COURSE_FAST=1 COURSE_AUTOFILL=1 COURSE_MODEL="${COURSE_MODEL:-smollm2-135m}" MPLBACKEND=Agg
python -m pytest -p no:cacheprovider tests notebooks --nbval-lax --nbval-current-env "$@"
