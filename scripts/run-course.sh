#!/usr/bin/env bash
# Set up (see setup.sh) and open the course in JupyterLab.
#   (no option)   students: the exercise notebooks. The first time, notebooks/student/*.ipynb are copied
#                 into ./my-notebooks/ (ignored by git; a notebook already there is never overwritten),
#                 and JupyterLab opens that folder, so your work never changes the repository's files.
#   --instructor  open the solution notebooks in notebooks/ instead (saving them changes tracked files)
#   --execute     instead, run every solution notebook top to bottom into ./outputs/ (papermill, plain-text
#                 progress), printing each notebook's wall time
#   --fast        with --execute: small sizes (FAST)
#   --site        execute every solution notebook into ./outputs/ (FAST unless --full), then build the course
#                 site into ./site/ (python -m course site; open site/index.html)
#   --full        with --site: the full sizes
#   --jobs N      with --execute or --site: N notebooks at once (one torch thread each), the longest first
#                 (by docs/notebook-times.md); the default 1 runs them one after the other, in order
# MY_NOTEBOOKS=folder chooses another working folder for the student copies.
set -euo pipefail
cd "$(dirname "$0")/.."

usage_error() { echo "error: $1 (options: --instructor, --execute [--fast], --site [--full], --jobs N)" >&2; exit 2; }
mode=student fast=False full=False jobs=1 want_jobs=
choose() {  # one mode per run
  [ "$mode" = student ] || usage_error "--instructor, --execute and --site exclude each other"
  mode=$1
}
for arg in "$@"; do
  if [ "$want_jobs" = 1 ]; then
    [[ "$arg" =~ ^[1-9][0-9]?$ ]] || usage_error "--jobs takes a number of notebooks at once, 1 to 99, got '$arg'"
    jobs=$arg want_jobs=
    continue
  fi
  case "$arg" in
    --jobs) want_jobs=1 ;;
    --instructor) choose instructor ;;
    --execute) choose execute ;;
    --site) choose site ;;
    --fast) fast=True ;;
    --full) full=True ;;
    *) usage_error "unknown option '$arg'" ;;
  esac
done
[ -z "$want_jobs" ] || usage_error "--jobs takes a number of notebooks at once, 1 to 99"
[ "$jobs" = 1 ] || [ "$mode" = execute ] || [ "$mode" = site ] || usage_error "--jobs applies to --execute and --site only"
[ "$fast" = False ] || [ "$mode" = execute ] || usage_error "--fast applies to --execute only"
[ "$full" = False ] || [ "$mode" = site ] || usage_error "--full applies to --site only"
if [ "$mode" = site ]; then
  fast=True
  [ "$full" = False ] || fast=False
fi

# COURSE_SET_UP=1: the caller (scripts/test.sh) has just run setup.sh and activated the venv
[ "${COURSE_SET_UP:-}" = 1 ] || bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate

if [ "$mode" = execute ] || [ "$mode" = site ]; then
  mkdir -p outputs
  export COURSE_PROGRESS=text  # an executed copy is read without a kernel: no live bars (course/progress.py)
  run_one() {  # one notebook into outputs/, then its wall time (or its failure) on one line
    local nb=$1 start=$SECONDS
    if papermill --log-level WARNING "$nb" "outputs/$(basename "$nb")" -p FAST "$fast"; then
      local took=$((SECONDS - start))
      echo "== $(basename "$nb"): $((took / 60)) min $((took % 60)) s"
    else
      echo "== $(basename "$nb"): FAILED (see above)"
      return 1
    fi
  }
  notebooks=(notebooks/[0-9]*.ipynb)
  start_all=$SECONDS
  if [ "$jobs" = 1 ]; then
    for nb in "${notebooks[@]}"; do
      echo "== $nb"
      run_one "$nb" || exit 1
    done
  else
    export COURSE_THREADS=1  # N kernels at once: one torch thread each, never more threads than cores
    mapfile -t notebooks < <(python -c 'import sys
from pathlib import Path
from course.instructor.notebook_times import read_times
times = read_times(Path("docs/notebook-times.md"), fast=sys.argv[1] == "True")
print("\n".join(sorted(sys.argv[2:], key=lambda nb: -times.get(Path(nb).stem, 0))))' "$fast" "${notebooks[@]}")
    echo "== ${#notebooks[@]} notebooks, $jobs at once, the longest first: ${notebooks[*]}"
    failures="$(mktemp)"
    for nb in "${notebooks[@]}"; do
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
      { run_one "$nb" || echo "$nb" >>"$failures"; } &
    done
    wait
    failed=$(cat "$failures"); rm -f "$failures"
    [ -z "$failed" ] || { echo "error: failed: $failed (their lines above say why)" >&2; exit 1; }
  fi
  total=$((SECONDS - start_all))
  echo "Executed notebooks are in outputs/ (all: $((total / 60)) min $((total % 60)) s)."
  python -m course check-outputs outputs
  [ "$mode" = execute ] || python -m course site --from outputs --out site
  exit 0
fi

folder=notebooks
if [ "$mode" = student ]; then
  folder="${MY_NOTEBOOKS:-my-notebooks}"
  mkdir -p "$folder"
  for nb in notebooks/student/[0-9]*.ipynb; do
    [ -e "$folder/$(basename "$nb")" ] || cp "$nb" "$folder/"
  done
  echo "== your notebooks are in $folder/ (copies of notebooks/student/; the solutions: --instructor)"
fi
args=()
[ "$(id -u)" = 0 ] && args+=(--allow-root)  # containers and cloud machines often run as root
exec jupyter lab ${args[@]+"${args[@]}"} "$folder/"
