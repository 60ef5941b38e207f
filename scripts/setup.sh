#!/usr/bin/env bash
# Set up everything the course needs, in ./.venv (idempotent: safe to run again).
#   TORCH_SPEC   which torch to install if none is there (default torch==2.13.0)
#   TORCH_INDEX  optional package index for it, e.g. https://download.pytorch.org/whl/cpu
#   PYTHON       interpreter for the venv (default python3, 3.10 or newer)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  echo "== installing ${TORCH_SPEC:-torch==2.13.0}"
  if [ -n "${TORCH_INDEX:-}" ]; then
    python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}" --index-url "$TORCH_INDEX"
  else
    python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
  fi
fi
echo "== installing the course package and its tools"
python -m pip install -q -e ".[dev]"
echo "== installing the kvpress peer without its dependencies (it pins an older transformers: see the file)"
python -m pip install -q --no-deps -r scripts/kvpress-peer.txt
echo "== fetching the offline model and corpus (once)"
python -m course fetch
echo "== training notebook 06's tiny models (once: stored in the course cache)"
python -m course train --all-variants --seeds 3 --preset fast --windows 2 --jobs 2
python -m course info
