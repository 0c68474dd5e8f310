#!/usr/bin/env bash
# Runs, sanitizes and measures opbridge's CUDA kernels on a GPU machine, in stages that each fit
# a 10-minute command:
#
#   scripts/cuda_check.sh prepare      on a machine with PyPI access (not the GPU machine): puts
#                                      the build tools the GPU machine lacks into .whl/ (wheels, and
#                                      .conan-home as .whl/conan-home.tgz: Eigen and the ORT headers),
#                                      and onnxruntime-gpu, cut down to sm_90, into .ortgpu/part-*
#                                      (see the parts below)
#   scripts/cuda_check.sh build        build and install opbridge for sm_90 only (H100/H200)
#   scripts/cuda_check.sh test         every device test through scripts/cuda_tests.py (a CUDA
#                                      error ends its process; the rest still run; the first
#                                      failure is reported first); records which opbridge
#                                      kernels ran (kernels.txt); CUDA_CHECK_HOST=1 adds
#                                      tests/cuda_ops/test_cuda_host.py with the image's compiler
#   scripts/cuda_check.sh memcheck     compute-sanitizer memcheck, restricted to opbridge's
#                                      kernels, over the device tests (graph captures apart: see
#                                      `capture`)
#   scripts/cuda_check.sh capture      the graph-capture tests: first with
#                                      PYTORCH_NO_CUDA_MEMORY_CACHING=1 and no sanitizer (what
#                                      memcheck's setting alone does to a capture), then under
#                                      memcheck with torch's caching allocator on
#   scripts/cuda_check.sh fuzz         the fuzzer's torch cases on the GPU (2000 cases, <= 150 s,
#                                      seed printed): the CPU op's verdicts and tolerances
#   scripts/cuda_check.sh racecheck | synccheck | initcheck
#                                      one compute-sanitizer tool each, <= 90 s, over a subset of
#                                      the device tests that launches every kernel
#   scripts/cuda_check.sh symbols      every kernel in the built libraries (cuobjdump -symbols)
#                                      against the ones the test stage saw running
#   scripts/cuda_check.sh receive N    keeps the carried .ortgpu/part-N in /tmp/ortgpu (the parts
#                                      together are larger than one call may carry)
#   scripts/cuda_check.sh ortunpack    joins the parts, checks their sha256 and unpacks onnxruntime-gpu
#                                      into /tmp/ortgpu-site (zstd, or the carried zstandard wheel)
#   scripts/cuda_check.sh ortgpu       d3: onnxruntime-gpu first on the path, the image's onnxruntime
#                                      shadowed: the ORT CUDA tests with CPU fallback disabled, then
#                                      the fuzzer's ORT cases on the CUDA provider (seed printed)
#   scripts/cuda_check.sh ortbench     benchmarks/ort_cuda_models.py: ORT CUDA, our nodes against the
#                                      plain exports' subgraphs (timed: run it alone)
#   scripts/cuda_check.sh par S1 S2 .. --   stages side by side (correctness stages only: not timed),
#                                      each into $OUT/stage-S.out, summaries printed in order
#   scripts/cuda_check.sh pack FILE    everything under $OUT into one .tgz (the device tool brings
#                                      back at most 8 files)
#   scripts/cuda_check.sh bench        benchmarks/benchmarks/bench_cuda.py (JSON + table)
#   scripts/cuda_check.sh kbench       benchmarks/cuda/kernel_bench (the launchers without torch,
#                                      each figure beside a copy; rebuilt incrementally)
#
# One session's GPU time in two calls of the device tool, back to back (the machine stays warm
# ~30 s between calls; a cold machine needs `build` again). OUT is kept in /tmp across the calls
# and packed into the tool's $OUT at the end of each (docs/cuda.md has the exact commands):
#   A  carry .whl .ortgpu/part-0 .ortgpu/part-1 .ortgpu/ortgpu.sha256
#      receive 0 receive 1 build par test memcheck capture fuzz -- bench pack FILE
#   B  carry .whl .ortgpu/part-2 .ortgpu/ortgpu.sha256 .ortgpu/zstandard-0.25.0-...whl
#      receive 2 par racecheck synccheck initcheck ortgpu -- symbols ortbench pack FILE
# Several stages run in order: `scripts/cuda_check.sh build test`. Results go to $OUT (the device
# tool's output folder; ./cuda-check-out when unset), named per stage.
#
# Environment: CUDA_CHECK_ARCH (default 90-real), CUDA_CHECK_K (pytest -k expression for the
# sanitizer stages), CUDA_CHECK_TIMEOUT (seconds per stage, default 540), CUDA_CHECK_SEED (fuzz),
# CUDA_CHECK_HOST (1: the host emulation in the test stage too).
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

# CUDA's tools where the toolkit installs them, when they are not on PATH.
[ -d /usr/local/cuda/bin ] && case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) PATH="$PATH:/usr/local/cuda/bin" ;; esac

# The build tools missing on the GPU machine (see the device tool's KINDS.md), as wheels for its
# Python (3.12, x86-64). Pure-Python packages published as sdists only are built into wheels here.
WHEELS_BINARY="cmeel cmeel-eigen==3.4.1"
WHEELS_PURE="conan==2.34.0 fasteners distro patch-ng truststore nanobind==3.1.0 scikit-build-core==1.1.2"
ORTGPU_VERSION=1.31.1
ORTGPU_PARTS=3  # 70.6 MB of zstd: three parts of ~23.5 MB, each carried by one call beside the tree

stage_prepare() {
  mkdir -p .whl
  grep -qx '/.whl/' .gitignore 2>/dev/null || grep -qx '/.whl/' .git/info/exclude 2>/dev/null ||
    echo '/.whl/' >> "$(git rev-parse --git-path info/exclude)"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $WHEELS_BINARY || return 1
  "$PY" -m pip wheel -q --no-deps -w .whl $WHEELS_PURE || return 1
  if ! find .conan-home -name onnxruntime_c_api.h 2>/dev/null | grep -q .; then
    log ".conan-home has no ONNX Runtime headers: build once here first (pip install --no-build-isolation .)"
    return 1
  fi
  # The conan cache as one archive inside .whl (23 MB of headers -> a few MB; one carried path less).
  tar czf .whl/conan-home.tgz .conan-home || return 1
  ls -la .whl
  du -sh .whl
  # onnxruntime-gpu for the GPU machine's Python (3.12), CUDA 13 build: its onnxruntime/ folder
  # without the TensorRT provider, the CUDA provider's device code cut to sm_90
  # (../shared/tools/fatbin_keep_arch.py, or FATBIN_KEEP_ARCH=path), tar | zstd -19 --long=27,
  # split into ORTGPU_PARTS parts (each carried by one call, a call carries at most 64 MiB).
  mkdir -p .ortgpu
  grep -qx '/.ortgpu/' .gitignore || echo '/.ortgpu/' >> "$(git rev-parse --git-path info/exclude)"
  if ! ls .ortgpu/part-* > /dev/null 2>&1; then
    local tool="${FATBIN_KEEP_ARCH:-$ROOT/../shared/tools/fatbin_keep_arch.py}" work
    [ -f "$tool" ] || { log "fatbin_keep_arch.py not found (set FATBIN_KEEP_ARCH)"; return 1; }
    work="$(mktemp -d)"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$work" "onnxruntime-gpu==$ORTGPU_VERSION" ||
      return 1
    (cd "$work" && unzip -q onnxruntime_gpu-*.whl && rm onnxruntime_gpu-*.whl onnxruntime/capi/libonnxruntime_providers_tensorrt.so &&
      "$PY" "$tool" onnxruntime/capi/libonnxruntime_providers_cuda.so cuda90.so "${ARCH%%-*}" &&
      mv cuda90.so onnxruntime/capi/libonnxruntime_providers_cuda.so && chmod 755 onnxruntime/capi/*.so &&
      tar cf - onnxruntime onnxruntime_gpu-*.dist-info | zstd -19 --long=27 -T0 -q -o ortgpu.tar.zst) || return 1
    (cd "$work" && sha256sum ortgpu.tar.zst) > .ortgpu/ortgpu.sha256
    (cd .ortgpu && split -n "$ORTGPU_PARTS" -d -a 1 "$work/ortgpu.tar.zst" part-)
    rm -rf "$work"
  fi
  # For a GPU machine without the zstd command (5.5 MB: carried with the last part, not in .whl).
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .ortgpu zstandard==0.25.0 || return 1
  ls -la .ortgpu
}

# Installs the carried wheels (no index: the GPU machine has no network).
# Once per machine (stages that run side by side find them installed).
use_wheels() {
  if [ ! -f /tmp/site/.installed ] && [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
      return 1
    touch /tmp/site/.installed
  fi
  [ -d /tmp/site ] && case ":${PYTHONPATH:-}:" in *:/tmp/site:*) ;; *) export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" ;; esac
  if [ ! -d .conan-home ] && [ -f .whl/conan-home.tgz ]; then
    tar xzf .whl/conan-home.tgz || return 1
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
  rm -f "$OUT/kernels.txt"
  # Device tests one by one through the isolating runner (a CUDA error cannot fail later tests).
  OPBRIDGE_CUDA_KERNEL_LOG="$OUT/kernels.txt" timeout "$STAGE_TIMEOUT" "$PY" scripts/cuda_tests.py \
    --log "$OUT/test.jsonl" -- -m cuda tests > "$OUT/test.log" 2>&1
  local rc=$?
  sed -n '/===== report =====/,$p' "$OUT/test.log"
  # The kernels' host emulation needs no GPU and CI runs it; with the image's compiler only on
  # request (CUDA_CHECK_HOST=1): its sanitized build took over 3 minutes of GPU time (H200,
  # 2026-11-30), more than the device tests.
  local rc2=0
  if [ "${CUDA_CHECK_HOST:-0}" != 0 ]; then
    run_pytest host tests/cuda_ops/test_cuda_host.py tests/cuda_ops/test_cuda.py -m "not cuda"
    rc2=$?
  fi
  [ -f "$OUT/kernels.txt" ] && sort -u -o "$OUT/kernels.txt" "$OUT/kernels.txt"
  [ $rc -eq 0 ] && [ $rc2 -eq 0 ]
}

# compute-sanitizer over pytest. torch's caching allocator is turned off so that every tensor is
# its own allocation: an access past a tensor's end is then outside any allocation, which memcheck
# reports (inside a cached pool block it would go unnoticed).
sanitize() {  # tool, log name, pytest -k expression, time limit (s)
  local tool="$1" name="$2" expr="$3" limit="${4:-$STAGE_TIMEOUT}"
  command -v compute-sanitizer > /dev/null || { log "compute-sanitizer not found"; return 1; }
  # Only our kernels are instrumented (torch's are not ours), except for initcheck: memory that an
  # uninstrumented kernel writes (torch's copy into a channels_last tensor, say) is then
  # "uninitialized" to it, a false report on every read of ours (seen on an H200, 2026-11-28).
  local filter=(--kernel-name kns=opbridge)
  [ "$tool" = initcheck ] && filter=()
  [ ${#filter[@]} -gt 0 ] && { compute-sanitizer "${filter[@]}" --version > /dev/null 2>&1 || filter=(); }
  local extra=()
  [ "$tool" = racecheck ] && extra=(--racecheck-report all)
  ${SANITIZE_ENV:-env PYTORCH_NO_CUDA_MEMORY_CACHING=1} timeout "$limit" compute-sanitizer --tool "$tool" \
    "${filter[@]}" "${extra[@]}" --error-exitcode 99 --print-limit 20 --target-processes all \
    "$PY" -m pytest -q -p no:cacheprovider -m cuda tests/cuda_ops/test_cuda.py -k "$expr" > "$OUT/$name.log" 2>&1
  local rc=$?
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|error" "$OUT/$name.log" | tail -n 20
  tail -n 30 "$OUT/$name.log"
  log "$tool exit status $rc (99: the sanitizer reported errors; 124: timed out)"
  return $rc
}

stage_memcheck() {
  use_wheels || return 1
  # Every device test except the float64 and bfloat16 repeats of the same index paths and the
  # graph captures (stage capture).
  sanitize memcheck memcheck "${CUDA_CHECK_K:-not bfloat16 and not (group_norm and float64) and not graph_capture}"
}

stage_capture() {
  use_wheels || return 1
  # 1. No sanitizer, caching allocator off (what the memcheck stage sets): an allocation during
  #    a capture then calls cudaMalloc, which a capture does not allow.
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 120 "$PY" -m pytest -q -rs -p no:cacheprovider -m cuda tests/cuda_ops/test_cuda.py \
    -k graph_capture > "$OUT/capture-nocache.log" 2>&1
  log "graph captures with PYTORCH_NO_CUDA_MEMORY_CACHING=1, no sanitizer: status $?"
  tail -n 15 "$OUT/capture-nocache.log"
  # 2. Under memcheck with the caching allocator on.
  SANITIZE_ENV=env sanitize memcheck capture-memcheck graph_capture 180
}

stage_fuzz() {
  use_wheels || return 1
  local seed="${CUDA_CHECK_SEED:-$(date +%s)}"
  log "fuzz seed $seed"
  timeout 150 "$PY" -m tests.fuzz.run --cases 2000 --device cuda --seed "$seed" --out "$OUT/fuzz-failures" \
    > "$OUT/fuzz.log" 2>&1
  local rc=$?
  grep -E "^==|cases|\[fail|\[crash|\[hang|total" "$OUT/fuzz.log" | tail -n 40
  return $rc
}

# One case per kernel family (every dtype the kernels are instantiated for), sized to finish
# within 90 s under the slower tools.
SUBSET="(group_norm and matches_reference and both and (G32 or 70000 or 131072 or 150001) and not float64) or (group_norm and channels_last and silu and not float64) or (inverse and matches_reference and batch0) or (ms_deform_attn and matches_reference and cpu and not float64) or (point_cloud_ops_cuda_match_cpu and not float64)"

stage_racecheck() { use_wheels && sanitize racecheck racecheck "${CUDA_CHECK_K:-$SUBSET}" 90; }
stage_synccheck() { use_wheels && sanitize synccheck synccheck "${CUDA_CHECK_K:-$SUBSET}" 90; }
# initcheck instruments torch's kernels too (see sanitize): float32 only, ~1 min.
INIT_SUBSET="(group_norm and matches_reference and both and (G32 or 70000) and float32) or (group_norm and channels_last and silu and float32) or (inverse and matches_reference and batch0 and float32) or (ms_deform_attn and matches_reference and cpu and float32) or (point_cloud_ops_cuda_match_cpu and float32)"
stage_initcheck() { use_wheels && sanitize initcheck initcheck "${CUDA_CHECK_K:-$INIT_SUBSET}" 150; }

stage_symbols() {
  local libs
  libs="$("$PY" -c "import opbridge, pathlib; p = pathlib.Path(opbridge.get_library_path()).parent; print(' '.join(str(x) for x in p.rglob('*.so')))")"
  : > "$OUT/symbols.txt"
  for lib in $libs; do
    cuobjdump -symbols "$lib" 2> /dev/null | awk '/STT_FUNC/ && /STO_ENTRY/ {print $NF}' >> "$OUT/symbols.txt"
  done
  sort -u -o "$OUT/symbols.txt" "$OUT/symbols.txt"
  local filt
  filt="$(command -v cu++filt || command -v c++filt || true)"
  [ -n "$filt" ] && "$filt" < "$OUT/symbols.txt" > "$OUT/symbols-demangled.txt"
  "$PY" - "$OUT" << 'PYEOF'
import pathlib, re, sys
out = pathlib.Path(sys.argv[1])
names = out / "symbols-demangled.txt"
kernels = sorted(set((names if names.exists() else out / "symbols.txt").read_text().split("\n")) - {""})
ran = (out / "kernels.txt").read_text().splitlines() if (out / "kernels.txt").exists() else []
def norm(k):
    # kernels.txt and cu++filt spell the same kernel differently: "(anonymous namespace)" or
    # "<unnamed>", "<float, 4, true>" or "<float, (int)4, (bool)1>".
    k = k.replace("(anonymous namespace)", "").replace("<unnamed>", "")
    k = k.replace("(bool)0", "false").replace("(bool)1", "true")
    k = re.sub(r"\((?:unsigned )?(?:int|long)\)(-?\d+)", r"\1", k)
    return re.sub(r"^void", "", re.sub(r"\s+", "", k)).split("(")[0]
seen = {norm(k) for k in ran}
missed = [k for k in kernels if norm(k) not in seen]
print(f"{len(kernels)} kernels in the libraries, {len(kernels) - len(missed)} seen running in the test stage")
for k in missed:
    print("NOT RUN:", k)
sys.exit(1 if missed or not kernels else 0)
PYEOF
}

stage_receive() {  # N: keep the carried .ortgpu/part-N until the last part has come
  local n="$1"
  mkdir -p /tmp/ortgpu
  [ -f ".ortgpu/part-$n" ] || { log "no .ortgpu/part-$n in this call: carry it"; return 1; }
  cp ".ortgpu/part-$n" /tmp/ortgpu/ || return 1
  cp .ortgpu/ortgpu.sha256 /tmp/ortgpu/ 2> /dev/null
  cp .ortgpu/zstandard-*.whl /tmp/ortgpu/ 2> /dev/null
  ls -la /tmp/ortgpu
}

ORTGPU_SITE=/tmp/ortgpu-site

stage_ortunpack() {
  use_wheels || return 1
  [ -f "$ORTGPU_SITE/.unpacked" ] && { log "onnxruntime-gpu already unpacked in $ORTGPU_SITE"; return 0; }
  (cd /tmp/ortgpu && [ "$(ls part-* | wc -l)" -eq "$ORTGPU_PARTS" ] && cat part-* > ortgpu.tar.zst &&
    sha256sum -c ortgpu.sha256) || {
    log "the onnxruntime-gpu parts are incomplete or corrupt: receive every part first"
    return 1
  }
  rm -rf "$ORTGPU_SITE" && mkdir -p "$ORTGPU_SITE" || return 1
  if command -v zstd > /dev/null; then
    zstd -d --long=27 -q -c /tmp/ortgpu/ortgpu.tar.zst | tar xf - -C "$ORTGPU_SITE" || return 1
  else
    "$PY" -c "import zstandard" 2> /dev/null ||
      "$PY" -m pip install -q --no-index --no-deps --target /tmp/site /tmp/ortgpu/zstandard-*.whl || return 1
    # --long=27 needs a 128 MiB window, more than zstandard's default limit.
    "$PY" -c "
import sys, tarfile, zstandard
with open(sys.argv[1], 'rb') as f:
    r = zstandard.ZstdDecompressor(max_window_size=2**27).stream_reader(f)
    tarfile.open(fileobj=r, mode='r|').extractall(sys.argv[2], filter='data')
" /tmp/ortgpu/ortgpu.tar.zst "$ORTGPU_SITE" || return 1
  fi
  touch "$ORTGPU_SITE/.unpacked"
  du -sh "$ORTGPU_SITE"
}

# The CUDA libraries ORT's CUDA provider loads (cuBLAS, cuDNN, cuFFT, cuRAND, cudart 13) from the
# image's nvidia-* wheels.
ort_env() {
  local libs
  libs="$("$PY" -c "import glob, os, nvidia; print(':'.join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d + '/*/lib/lib*.so*')})))" 2>/dev/null)"
  export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PYTHONPATH="$ORTGPU_SITE${PYTHONPATH:+:$PYTHONPATH}"
}

stage_ortgpu() {
  stage_ortunpack || return 1
  ort_env
  "$PY" -c "import torch, onnxruntime as o; print(o.__file__, o.__version__, o.get_available_providers())" |
    tee "$OUT/ortgpu.txt"
  "$PY" -c "import onnxruntime as o; import sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" ||
    { log "onnxruntime-gpu is not the onnxruntime imported"; return 1; }
  timeout "$STAGE_TIMEOUT" "$PY" scripts/cuda_tests.py \
    --log "$OUT/ortgpu.jsonl" -- -m cuda tests/cuda_ops/test_cuda.py tests/declarations/test_user_op.py tests/cli/test_new_op.py \
    tests/install/test_cmake_consumer.py -k "ort or cpp_program" > "$OUT/ortgpu.log" 2>&1
  local rc=$?
  sed -n '/===== report =====/,$p' "$OUT/ortgpu.log"
  local seed="${CUDA_CHECK_SEED:-$(date +%s)}"
  log "ORT CUDA fuzz seed $seed"
  timeout 150 "$PY" -m tests.fuzz.run --cases 1500 --kind ort --device cuda --seed "$seed" \
    --out "$OUT/ortfuzz-failures" > "$OUT/ortfuzz.log" 2>&1
  local rc2=$?
  grep -E "^==|cases|\[fail|\[crash|\[hang|total|CUDAExecutionProvider" "$OUT/ortfuzz.log" | tail -n 40
  [ $rc -eq 0 ] && [ $rc2 -eq 0 ]
}

stage_ortbench() {
  stage_ortunpack || return 1
  ort_env
  timeout "$STAGE_TIMEOUT" "$PY" benchmarks/ort_cuda_models.py --json "$OUT/ort_cuda_models.json" 2>&1 |
    tee "$OUT/ortbench.log" | tail -n 60
  return "${PIPESTATUS[0]}"
}

stage_kbench() {
  BUILD=/tmp/kernel_bench timeout 300 bash benchmarks/cuda/build.sh "sm_${ARCH%%-*}" > "$OUT/kbench-build.log" 2>&1 ||
    { tail -n 30 "$OUT/kbench-build.log"; return 1; }
  timeout "$STAGE_TIMEOUT" /tmp/kernel_bench/kernel_bench 2>&1 | tee "$OUT/kbench.log" | tail -n 80
  return "${PIPESTATUS[0]}"
}

stage_bench() {
  use_wheels || return 1
  timeout "$STAGE_TIMEOUT" "$PY" benchmarks/benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json" 2>&1 |
    tee "$OUT/bench.log" | tail -n 80
}

stage_par() {  # stages side by side; each one's output into $OUT/stage-NAME.out
  use_wheels || return 1
  local pids=() names=() rc=0 i
  for st in "$@"; do
    ( "stage_$st" ) > "$OUT/stage-$st.out" 2>&1 &
    pids+=($!)
    names+=("$st")
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    local r=$?
    log "stage ${names[$i]} (side by side) exit status $r"
    [ $r -eq 0 ] || rc=1
  done
  for st in "${names[@]}"; do
    echo "------------------------------------------------ $st"
    tail -n "${CUDA_CHECK_PAR_TAIL:-30}" "$OUT/stage-$st.out"
  done
  return $rc
}

[ $# -gt 0 ] || { sed -n '2,52p' "$0"; exit 2; }
status=0
while [ $# -gt 0 ]; do
  stage="$1"
  shift
  case "$stage" in
    prepare | env | build | test | memcheck | capture | fuzz | racecheck | synccheck | initcheck | symbols | ortunpack | ortgpu | ortbench | bench | kbench)
      log "stage $stage"
      "stage_$stage" || { status=1; log "stage $stage FAILED"; }
      ;;
    receive)
      log "stage receive $1"
      stage_receive "$1" || status=1
      shift
      ;;
    par)
      group=()
      while [ $# -gt 0 ] && [ "$1" != "--" ]; do group+=("$1"); shift; done
      [ $# -gt 0 ] && shift
      log "stages side by side: ${group[*]}"
      stage_par "${group[@]}" || { status=1; log "a stage side by side FAILED"; }
      ;;
    pack)
      # Saved fuzz failures are many small files: at most 40 per folder travel.
      mkdir -p "$(dirname "$1")"
      (cd "$OUT" && { find . -path './*failures*' -type f | sort | awk -F/ '{n[$2]++} n[$2] <= 40'
        find . -type f ! -path './*failures*'; } | tar czf "$1" -T -) &&
        log "packed $OUT into $1 ($(du -h "$1" | cut -f1))"
      shift
      ;;
    *) echo "unknown stage '$stage'" >&2; exit 2 ;;
  esac
done
exit $status
