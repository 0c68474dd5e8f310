#!/usr/bin/env bash
# Builds benchmarks/cuda/kernel_bench (see kernel_bench.cu) with nvcc, one object per source in
# parallel, rebuilding only what changed since the last build: after an edit to one kernel file
# only that file is compiled again (seconds, not the package's full build).
#
#   benchmarks/cuda/build.sh [ARCH]      ARCH: nvcc's -arch value, default sm_90 (H100/H200)
#   BUILD=/tmp/kb benchmarks/cuda/build.sh && /tmp/kb/kernel_bench gn
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ARCH="${1:-sm_90}"
BUILD="${BUILD:-$ROOT/build/kernel_bench}"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
mkdir -p "$BUILD"
FLAGS=(-O3 -std=c++17 -arch="$ARCH" --expt-relaxed-constexpr -I"$ROOT" -I"$ROOT/cuda" -I"$ROOT/cpp/include")
# The kernel files hold the ops' CUDA compute functions too, which need the declarations and the
# framework-free op machinery (cpp/common).
SOURCES=(ops/group_norm/group_norm_kernel.cu ops/inverse/inverse_kernel.cu
         ops/ms_deform_attn/ms_deform_attn_kernel.cu cuda/common/device.cpp benchmarks/cuda/kernel_bench.cu
         ops/group_norm/group_norm_decl.cpp ops/inverse/inverse_decl.cpp
         ops/ms_deform_attn/ms_deform_attn_decl.cpp cpp/common/op_decl.cpp cpp/common/kernel.cpp)
objects=()
pids=()
for src in "${SOURCES[@]}"; do
  obj="$BUILD/$(basename "$src").$ARCH.o"
  objects+=("$obj")
  # Rebuild when the source or any header it may include is newer than the object.
  if [ ! -f "$obj" ] || [ -n "$(find "$ROOT/$src" "$ROOT/ops" "$ROOT/cuda" "$ROOT/cpp/include" -newer "$obj" -name '*.*' -print -quit)" ]; then
    lang=()
    case "$src" in *.cpp) lang=(-x cu) ;; esac
    "$NVCC" "${FLAGS[@]}" "${lang[@]}" -c "$ROOT/$src" -o "$obj" &
    pids+=($!)
  fi
done
for p in "${pids[@]+"${pids[@]}"}"; do wait "$p"; done
"$NVCC" -arch="$ARCH" "${objects[@]}" -o "$BUILD/kernel_bench"
echo "$BUILD/kernel_bench"
