#!/usr/bin/env bash
# Runs opbridge's torch-free tests against several onnxruntime versions with ONE built wheel:
# the library is built once (against the API-29 headers) and must work on every ORT >= 1.17.
#
#   scripts/ort_matrix.sh [ORT_VERSION ...]      default: 1.17.3 1.24.4 1.32.0
#
# 1. builds the wheel with the current (dev) Python: pip wheel --no-build-isolation (reuses build/);
# 2. exports a few models with torch from that environment and the wheel's opbridge
#    (tests/helpers/exported_models.py), once per wheel;
# 3. per version: a torch-free venv under $HOME/.cache/opbridge-ort-matrix/venv-<ver> (created once, reused while
#    its requirements stay the same) with onnxruntime==<ver>, numpy, onnx, onnxscript, onnx-ir,
#    pytest and the wheel (--no-deps), runs the torch-free test modules (tests/ort/test_ort_*.py,
#    tests/ops/test_ort_inverse.py, tests/cli/test_check.py, tests/optimize/test_optimize*.py: they
#    never import torch). An onnxruntime older than 1.18 gets the `tools` extra's floors
#    (pyproject.toml) exactly: the oldest runtime and the
#    oldest onnx, onnxscript and onnx-ir opbridge supports, together; the others get the newest.
# Environment: PYTHON (dev interpreter, default: python), OPBRIDGE_MATRIX_DIR (wheel and models, default
# .ort-matrix), OPBRIDGE_ORT_VENV_DIR (the venvs, default $HOME/.cache/opbridge-ort-matrix).
# Exit status: non-zero when any version fails.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=${PYTHON:-python}
cache=${OPBRIDGE_MATRIX_DIR:-$root/.ort-matrix}
# The venvs outlive the clone (CI starts from a fresh one): kept in $HOME like the torch matrix's.
venvs=${OPBRIDGE_ORT_VENV_DIR:-$HOME/.cache/opbridge-ort-matrix}
if [ $# -gt 0 ]; then versions=("$@"); else versions=(1.17.3 1.24.4 1.32.0); fi
tests=(tests/ort/test_ort_*.py tests/ops/test_ort_inverse.py tests/cli/test_check.py tests/optimize/test_optimize.py tests/optimize/test_optimize_files.py)
mkdir -p "$cache" "$venvs"
t_start=$SECONDS

# The `tools` extra's floors, exact: "onnx==1.23 onnx-ir==1.1 onnxscript==0.5.7".
floors=$("$py" scripts/extra_floors.py tools)
# onnxruntime < 1.18 imports only with numpy < 2.
deps_for() {
  case "$1" in
    1.1[0-7].*) echo "numpy<2 $floors" ;;
    *) echo "numpy onnx onnxscript onnx-ir" ;;
  esac
}

echo "== building the wheel"
rm -rf "$cache/dist"
"$py" -m pip wheel --no-build-isolation --no-deps -q -w "$cache/dist" .
wheel=$(ls "$cache"/dist/opbridge-*.whl)
# Content key: the wheel's RECORD (a hash per file; zip timestamps change on every build) and the
# model definitions. Models are exported again only when it changes.
sha=$("$py" - "$wheel" tests/helpers/exported_models.py <<'PY'
import hashlib, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
h = hashlib.sha256(z.read(record))
h.update(open(sys.argv[2], "rb").read())
print(h.hexdigest()[:16])
PY
)
echo "   $(basename "$wheel") ($((SECONDS - t_start)) s)"

models="$cache/models"
if [ "$(cat "$models/.wheel" 2>/dev/null || true)" != "$sha" ]; then
  echo "== exporting test models (torch, dev environment, opbridge from the wheel)"
  rm -rf "$models" "$cache/unpacked"
  "$py" -m zipfile -e "$wheel" "$cache/unpacked"
  if ! PYTHONPATH="$cache/unpacked" "$py" tests/helpers/exported_models.py "$models" > "$cache/export.log" 2>&1; then
    cat "$cache/export.log"
    exit 1
  fi
  echo "$sha" > "$models/.wheel"
  echo "   $(ls "$models"/*.onnx | wc -l) models ($((SECONDS - t_start)) s)"
fi

declare -A result
status=0
for v in "${versions[@]}"; do
  venv="$venvs/venv-$v"
  t0=$SECONDS
  deps="onnxruntime==$v $(deps_for "$v") pytest (python $("$py" -c 'import sys; print(sys.version.split()[0])'))"
  if [ "$(cat "$venv/.ready" 2>/dev/null || true)" != "$deps" ]; then
    echo "== creating $venv: $deps"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    # shellcheck disable=SC2086  # several requirement specs
    "$venv/bin/python" -m pip install -q ${deps% (python *}
    echo "$deps" > "$venv/.ready"
  fi
  "$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$wheel"
  echo "== onnxruntime $v ($("$venv/bin/python" -c 'import importlib.metadata as m; print(", ".join(f"{d} {m.version(d)}" for d in ("onnx", "onnxscript", "onnx-ir", "numpy")))'))"
  if OPBRIDGE_EXPORTED_MODELS="$models" "$venv/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}"; then
    result[$v]="passed ($((SECONDS - t0)) s)"
  else
    result[$v]="FAILED ($((SECONDS - t0)) s)"
    status=1
  fi
done

echo "== summary ($((SECONDS - t_start)) s in all)"
for v in "${versions[@]}"; do
  echo "  onnxruntime $v: ${result[$v]}"
done
exit $status
