#!/usr/bin/env bash
# Builds the torch extension of an earlier commit with its torch namespace renamed to
# opbridge_base, for benchmarks/stable_abi_overhead.py (both extensions in one process).
#
#   scripts/build_baseline_torch.sh COMMIT [DIR]     in the build venv (README Quick start)
#
# COMMIT: an opbridge commit, e.g. the one before the stable-ABI port (libtorch's C++ API) or
# the one before a change of the adapters. DIR (default: a new temp dir) receives the sources and the build;
# prints the path of the library. CUDA and the Python module are left out (only the CPU kernels
# are compared).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
commit=${1:?usage: scripts/build_baseline_torch.sh COMMIT [DIR]}
dir=${2:-$(mktemp -d)}
mkdir -p "$dir"
git -C "$root" archive "$commit" | tar -x -C "$dir"
cd "$dir"
# (Also STABLE_TORCH_LIBRARY_*: a commit on the stable ABI, whose op files take the namespace from
# opbridge_add_op_library's NAMESPACE but whose library-wide helper ops name it.)
grep -rl "TORCH_LIBRARY_FRAGMENT(opbridge\|TORCH_LIBRARY_IMPL(opbridge" cpp cuda | xargs -r sed -i \
  's/TORCH_LIBRARY_FRAGMENT(opbridge,/TORCH_LIBRARY_FRAGMENT(opbridge_base,/; s/TORCH_LIBRARY_IMPL(opbridge,/TORCH_LIBRARY_IMPL(opbridge_base,/'
# A commit whose torch ops come from the generic kernel names its namespace in cpp/torch/entry.cpp.
if [ -f cpp/torch/entry.cpp ]; then
  sed -i 's/OPBRIDGE_TORCH_LIBRARY("opbridge",/OPBRIDGE_TORCH_LIBRARY("opbridge_base",/' cpp/torch/entry.cpp
fi
sed -i 's/opbridge_add_op_library(opbridge DOMAIN ai.opbridge NAMESPACE opbridge /opbridge_add_op_library(opbridge DOMAIN ai.opbridge NAMESPACE opbridge_base /' CMakeLists.txt
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DOPBRIDGE_WITH_CUDA=OFF -DOPBRIDGE_WITH_PYTHON_MODULE=OFF \
  -DOPBRIDGE_CONAN_HOME="$root/.conan-home" -DPython_EXECUTABLE="$(command -v python)" > build.log 2>&1
ninja -C build opbridge_torch >> build.log 2>&1
echo "$dir/build/libopbridge_torch.so"
