#!/usr/bin/env bash
# Set up (see setup.sh), then run the whole test suite: unit tests, and every notebook executed
# top to bottom in FAST mode (solution copies, and student copies with AUTOFILL) on SmolLM2-135M;
# then every solution notebook again on gpt2-random (GPT-2's architecture and shapes, random weights),
# which proves the GPT-2 code paths offline: its scientific claims are recorded, not asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export COURSE_FAST=1 COURSE_AUTOFILL=1 COURSE_MODEL="${COURSE_MODEL:-smollm2-135m}" MPLBACKEND=Agg COURSE_PROGRESS=text
python -m pytest -p no:cacheprovider tests notebooks --nbval-lax --nbval-current-env "$@"
COURSE_MODEL=gpt2-random python -m pytest -p no:cacheprovider notebooks/[0-9]*.ipynb --nbval-lax --nbval-current-env "$@"
