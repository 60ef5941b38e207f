#!/usr/bin/env bash
# An instructor's install, checked from scratch: a fresh venv, torch, then the package as pip installs it from a
# copy of this repository (not editable), used from a folder outside the repository:
#   1. without the instructor extra, `python -m course grade` stops with one line naming the extra;
#   2. with it (pip install ".[instructor]"), the student copies are released into a new folder with a grading key
#      and checked, two small submissions are graded with that key (two at once), and a site is built from one
#      notebook executed by papermill.
#   TORCH_SPEC   the torch to install (default torch==2.13.0)
#   TORCH_INDEX  optional package index for it, e.g. https://download.pytorch.org/whl/cpu
#   PYTHON       interpreter for the venv (default python3)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
unset PYTHONPATH VIRTUAL_ENV MPLBACKEND  # nothing of the repository's environment (figures drawn inline)
"${PYTHON:-python3}" -m venv "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
echo "== fresh venv: ${TORCH_SPEC:-torch==2.13.0}, then the package without extras"
python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}" ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}
mkdir "$work/src"  # a copy of what the package is built from: the build leaves nothing in the repository
tar -C "$repo" --exclude=__pycache__ -cf - pyproject.toml README.md course | tar -C "$work/src" -xf -
python -m pip install -q "$work/src"
cd "$work"

echo "== without the instructor extra, grade says what to install"
mkdir -p class/alice class/bob
if python -m course grade class --key key.json 2>err.txt; then
  echo "grade ran without the instructor extra"; exit 1
fi
cat err.txt
[ "$(wc -l <err.txt)" -eq 1 ] && grep -q 'attention-sinks-course\[instructor\]' err.txt

echo "== with the instructor extra: release, grade, site"
python -m pip install -q "$work/src[instructor]"
python -m course release --notebooks "$repo/notebooks" --out student >/dev/null
python -m course release --notebooks "$repo/notebooks" --out student --check
python -m course release --notebooks "$repo/notebooks" --out graded --hide-answers --key key.json >/dev/null
python - <<'EOF'
import nbformat

good = ("def kv_cache_bytes(n_layers, kv_heads, head_dim, tokens, batch=1, dtype_bytes=2):\n"
        "    return 2 * n_layers * kv_heads * head_dim * tokens * batch * dtype_bytes\n")
check = 'kv_cache_bytes = check("01.kv_cache_bytes", kv_cache_bytes)'
for student, code in (("alice", good), ("bob", good.replace("2 *", "1 *", 1))):
    cells = ["from course.exercises import check", code, check]
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]),
                   f"class/{student}/01_kv_cache.ipynb")
site_nb = nbformat.v4.new_notebook(cells=[
    nbformat.v4.new_markdown_cell("# The KV cache"),
    nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")])
site_nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbformat.write(site_nb, "01_kv_cache.ipynb")
EOF
jobs=$(( $(nproc) < 2 ? $(nproc) : 2 ))
python -m course grade class --key key.json --jobs "$jobs" --timeout 120 --out book >/dev/null
python - <<'EOF'
import json

kv = {r["student"]: r["status"] for r in json.load(open("book/gradebook.json")) if r["exercise"] == "01.kv_cache_bytes"}
assert kv == {"alice": "pass", "bob": "wrong"}, kv
print("graded:", kv)
EOF
mkdir executed
papermill -k python3 --log-level WARNING --no-progress-bar 01_kv_cache.ipynb executed/01_kv_cache.ipynb
python -m course site --from executed --out site --root "$repo" --partial
grep -q '<img' site/01_kv_cache.html
echo "instructor install checked in $(( $(date +%s) - start )) s"
