#!/usr/bin/env bash
# Runs, sanitizes and measures opbridge's CUDA kernels on a GPU machine, in stages that each fit
# a 10-minute command:
#
#   scripts/cuda_check.sh prepare      on a machine with PyPI access (not the GPU machine): puts
#                                      the build tools the GPU machine lacks into .whl/ (wheels)
#                                      and checks that .conan-home/ holds the ONNX Runtime headers
#   scripts/cuda_check.sh build        build and install opbridge for sm_90 only (H100/H200)
#   scripts/cuda_check.sh test         tests/test_cuda.py, tests/test_cuda_host.py and every
#                                      `cuda`-marked test
#   scripts/cuda_check.sh memcheck     compute-sanitizer memcheck over the CUDA device tests
#   scripts/cuda_check.sh racecheck    compute-sanitizer racecheck + synccheck over the tests of
#                                      the kernels that use shared memory (GroupNorm, Inverse)
#   scripts/cuda_check.sh bench        benchmarks/benchmarks/bench_cuda.py (JSON + table)
#
# Several stages run in order: `scripts/cuda_check.sh build test`. Results go to $OUT (the device
# tool's output folder; ./cuda-check-out when unset): at most 8 files, named per stage.
# The GPU machine has no network: carry `.whl` and `.conan-home` with every call, e.g. the device
# tool's run with command "bash scripts/cuda_check.sh build test" and carry [".whl", ".conan-home"].
# Between calls the machine stays warm for a short while only: issue the next stage right away
# (a cold machine needs `build` again).
#
# Environment: CUDA_CHECK_ARCH (default 90-real), CUDA_CHECK_K (pytest -k expression for the
# sanitizer stages), CUDA_CHECK_TIMEOUT (seconds per stage, default 540).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/cuda-check-out}"
mkdir -p "$OUT"
ARCH="${CUDA_CHECK_ARCH:-90-real}"
STAGE_TIMEOUT="${CUDA_CHECK_TIMEOUT:-540}"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1

log() { echo "[cuda_check $(date +%H:%M:%S)] $*"; }

# The build tools missing on the GPU machine (see the device tool's KINDS.md), as wheels for its
# Python (3.12, x86-64). Pure-Python packages published as sdists only are built into wheels here.
WHEELS_BINARY="cmeel cmeel-eigen==3.4.1"
WHEELS_PURE="conan==2.34.0 fasteners distro patch-ng truststore"

stage_prepare() {
  mkdir -p .whl
  grep -qx '/.whl/' .gitignore 2>/dev/null || grep -qx '/.whl/' .git/info/exclude 2>/dev/null ||
    echo '/.whl/' >> "$(git rev-parse --git-path info/exclude)"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $WHEELS_BINARY || return 1
  "$PY" -m pip wheel -q --no-deps -w .whl $WHEELS_PURE || return 1
  ls -la .whl
  if ! find .conan-home -name onnxruntime_c_api.h 2>/dev/null | grep -q .; then
    log ".conan-home has no ONNX Runtime headers: build once here first (pip install --no-build-isolation .)"
    return 1
  fi
  du -sh .whl .conan-home
  log "carry .whl and .conan-home to the GPU machine"
}

# Installs the carried wheels (no index: the GPU machine has no network).
use_wheels() {
  if [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
      return 1
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  "$PY" -c "import conans" 2> /dev/null || { log "conan is not importable: run 'prepare' and carry .whl"; return 1; }
}

stage_env() {
  {
    date
    nvidia-smi || true
    nvcc --version || true
    "$PY" -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" || true
    "$PY" -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())" || true
    command -v compute-sanitizer || true
  } > "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
}

stage_build() {
  stage_env
  use_wheels || return 1
  # The ORT headers from the carried conan cache, as a local folder (no download).
  local ort_inc
  ort_inc="$(dirname "$(find .conan-home -path '*/p/include/onnxruntime_c_api.h' | head -1)")"
  [ -f "$ort_inc/onnxruntime_c_api.h" ] || { log "no ORT headers in .conan-home: carry it"; return 1; }
  log "building for CUDA architectures $ARCH (ORT headers: $ort_inc)"
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" timeout "$STAGE_TIMEOUT" "$PY" -m pip install -v --no-build-isolation \
    --no-deps --no-index -Cbuild-dir=build/cuda-check -Ccmake.define.OPBRIDGE_WITH_CUDA=ON \
    -Ccmake.define.OPBRIDGE_CUDA_ARCHITECTURES="$ARCH" -Ccmake.define.OPBRIDGE_ORT_INCLUDE_DIR="$ort_inc" . \
    > "$OUT/build.log" 2>&1
  local rc=$?
  tail -n 40 "$OUT/build.log"
  [ $rc -eq 0 ] || { log "build failed ($rc)"; return $rc; }
  "$PY" -c "import opbridge, json; print(json.dumps(opbridge.build_info()))" | tee -a "$OUT/build.log"
}

run_pytest() {  # name, pytest args...
  local name="$1"
  shift
  timeout "$STAGE_TIMEOUT" "$PY" -m pytest -q -rs -p no:cacheprovider --junitxml="$OUT/$name-junit.xml" "$@" \
    > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 60 "$OUT/$name.log"
  return $rc
}

stage_test() {
  use_wheels || return 1
  run_pytest test tests/test_cuda.py tests/test_cuda_host.py
  local rc=$?
  # Every other cuda-marked test (the fuzzers, exporters, ... where they have CUDA cases).
  timeout "$STAGE_TIMEOUT" "$PY" -m pytest -q -rs -p no:cacheprovider -m cuda tests --ignore=tests/test_cuda.py \
    --ignore=tests/test_cuda_host.py >> "$OUT/test.log" 2>&1
  local rc2=$?
  [ $rc2 -eq 5 ] && rc2=0  # no tests selected
  tail -n 20 "$OUT/test.log"
  [ $rc -eq 0 ] && [ $rc2 -eq 0 ]
}

# compute-sanitizer over pytest. torch's caching allocator is turned off so that every tensor is
# its own allocation: an access past a tensor's end is then outside any allocation, which memcheck
# reports (inside a cached pool block it would go unnoticed).
sanitize() {  # tool, log name, pytest -k expression
  local tool="$1" name="$2" expr="$3"
  command -v compute-sanitizer > /dev/null || { log "compute-sanitizer not found"; return 1; }
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "$STAGE_TIMEOUT" compute-sanitizer --tool "$tool" --error-exitcode 99 \
    --print-limit 20 --target-processes all "$PY" -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py \
    -k "$expr" > "$OUT/$name.log" 2>&1
  local rc=$?
  grep -E "ERROR SUMMARY|passed|failed|error" "$OUT/$name.log" | tail -n 20
  tail -n 30 "$OUT/$name.log"
  log "$tool exit status $rc (99: the sanitizer reported errors; 124: timed out)"
  return $rc
}

stage_memcheck() {
  use_wheels || return 1
  # Default: every device test except the float64 and bfloat16 repeats of the same index paths
  # (float64 keeps its own vector width: its MSDA / Inverse cases stay in).
  sanitize memcheck memcheck "${CUDA_CHECK_K:-not bfloat16 and not (group_norm and float64)}"
}

stage_racecheck() {
  use_wheels || return 1
  local expr="${CUDA_CHECK_K:-(group_norm and float32) or (inverse and not ort)}"
  sanitize racecheck racecheck "$expr"
  local rc=$?
  sanitize synccheck synccheck "$expr"
  local rc2=$?
  [ $rc -eq 0 ] && [ $rc2 -eq 0 ]
}

stage_bench() {
  use_wheels || return 1
  timeout "$STAGE_TIMEOUT" "$PY" benchmarks/benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json" 2>&1 |
    tee "$OUT/bench.log" | tail -n 80
}

[ $# -gt 0 ] || { sed -n '2,25p' "$0"; exit 2; }
status=0
for stage in "$@"; do
  case "$stage" in
    prepare | env | build | test | memcheck | racecheck | bench)
      log "stage $stage"
      "stage_$stage" || { status=1; log "stage $stage FAILED"; }
      ;;
    all)
      for s in build test memcheck racecheck bench; do
        log "stage $s"
        "stage_$s" || { status=1; log "stage $s FAILED"; [ "$s" = build ] && break; }
      done
      ;;
    *) echo "unknown stage '$stage'" >&2; exit 2 ;;
  esac
done
exit $status
