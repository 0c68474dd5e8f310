#!/usr/bin/env bash
# Installs a built opbridge wheel into a fresh venv and runs a smoke subset of the tests against it.
#
#   scripts/wheel_smoke.sh [WHEEL]      default: dist/opbridge-*-manylinux*.whl (scripts/build_wheel.sh)
#
# The venv gets binary wheels only (--only-binary :all:, so nothing is compiled there): the wheel
# with its `export`, `test` and `onnxruntime` extras (torch>=2.11, onnx, onnxscript, onnx-ir,
# numpy, pytest, the CPU onnxruntime; scripts/ortgpu_install_check.sh installs onnxruntime-gpu),
# torch held at the build venv's release (any from 2.11 on would do: scripts/torch_matrix.sh runs
# others; this one is at hand, where another would download gigabytes). The tests chosen need no compiler (no CMake consumers, no user ops)
# and run in about a minute: the torch-import rules, the ORT side (also with no ONNX Runtime
# installed, and the extras in the metadata), `opbridge check`, the numpy
# kernels, GroupNorm in torch and ORT, and the demo (export with both exporters, run in ORT).
# Environment: PYTHON (creates the venv; default: python3), OPBRIDGE_SMOKE_DIR (default: a temp dir,
# removed afterwards).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [ $# -gt 0 ]; then
  wheel=$1
else
  wheel=$(ls -t dist/opbridge-*-manylinux*.whl 2>/dev/null | head -1 || true)
fi
if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
  echo "wheel_smoke.sh: no wheel given and none in dist/ (run scripts/build_wheel.sh)" >&2
  exit 2
fi
wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
if [ -n "${OPBRIDGE_SMOKE_DIR:-}" ]; then
  dir=$OPBRIDGE_SMOKE_DIR
  rm -rf "$dir/venv"
else
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
fi
t0=$SECONDS

echo "== fresh venv: $(basename "$wheel")[export,test,onnxruntime], binary wheels only"
"${PYTHON:-python3}" -m venv "$dir/venv"
py=$dir/venv/bin/python
# Byte-compiled at install (pip's default): the tests start many interpreters, and with
# PYTHONDONTWRITEBYTECODE each would compile torch's modules again.
build_torch=$(python -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null || true)
if ! "$py" -m pip install -q --only-binary :all: "$wheel[export,test,onnxruntime]" ${build_torch:+"torch==$build_torch"} \
    > "$dir/pip.log" 2>&1; then
  cat "$dir/pip.log"
  echo "wheel_smoke.sh: pip install failed" >&2
  exit 1
fi
"$py" - <<'PY'
import importlib.metadata as md, sys
import opbridge
# The tests must exercise the installed wheel, not the source tree.
assert opbridge.__file__.startswith(sys.prefix), f"opbridge imported from {opbridge.__file__}, not {sys.prefix}"
print(f"   opbridge {opbridge.__version__}, torch {md.version('torch')}, onnxruntime {md.version('onnxruntime')}")
PY
echo "   ($((SECONDS - t0)) s)"

tests=(tests/install/test_torch_import.py tests/ort/test_ort_runtime.py tests/ort/test_ort_exported.py tests/cli/test_check.py
       tests/core/test_core.py tests/ops/test_group_norm.py tests/cli/test_cli.py tests/install/test_without_onnxruntime.py)
echo "== pytest ${tests[*]}"
"$py" -m pytest -q -p no:cacheprovider "${tests[@]}"
echo "== smoke tests passed ($((SECONDS - t0)) s)"
