#!/usr/bin/env bash
# Set up (see setup.sh) and open the course in JupyterLab.
#   --execute   instead, run every notebook top to bottom into ./outputs/ (papermill)
#   --fast      with --execute: small sizes (minutes instead of about an hour on a laptop CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
if [ "${1:-}" = "--execute" ]; then
  mkdir -p outputs
  fast=False
  [ "${2:-}" = "--fast" ] && fast=True
  for nb in notebooks/[0-9]*.ipynb; do
    echo "== $nb"
    papermill --log-level WARNING "$nb" "outputs/$(basename "$nb")" -p FAST "$fast"
  done
  echo "Executed notebooks are in outputs/."
else
  args=()
  [ "$(id -u)" = 0 ] && args+=(--allow-root)  # containers and cloud machines often run as root
  exec jupyter lab "${args[@]}" notebooks/
fi
