#!/usr/bin/env bash
# GroupNorm's forward kernel before and after a change, side by side in one process
# (group_norm_ab.cpp says what it times and prints). From anywhere in the repository, with opbridge
# installed from it (the program takes the library's cache choices):
#   benchmarks/cpp/group_norm_ab.sh [--rounds R] [--groups G] [--nchw] [--silu] [--fresh] [--backward] N,C,H,W ...
# A: ops/group_norm/group_norm_simd.h and group_norm_backward_simd.h at GN_AB_A, a git revision
# (default HEAD) or a folder holding both; B: the ones in the folder GN_AB_B (default: the working
# tree's ops/group_norm). The other headers are the working tree's. The program is built in GN_AB_OUT
# (default: a new temporary folder) and runs with OMP_NUM_THREADS=2 OMP_PROC_BIND=close unless
# they are set. Needs g++ (or $CXX) and a CPU with AVX2 and FMA. Exit status: the program's (1
# where A's and B's outputs differ).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
python=${PYTHON:-python}
pkg=$("$python" -c "import opbridge, os; print(os.path.dirname(opbridge.__file__))")
out=${GN_AB_OUT:-$(mktemp -d)}
mkdir -p "$out"
a=${GN_AB_A:-HEAD}
b=${GN_AB_B:-ops/group_norm}
headers=(group_norm_simd.h group_norm_backward_simd.h)
if [ ! -f "$a/group_norm_simd.h" ]; then
  mkdir -p "$out/a"
  for h in "${headers[@]}"; do git show "$a:ops/group_norm/$h" > "$out/a/$h"; done
  a=$out/a
fi
for side in "$a" "$b"; do
  for h in "${headers[@]}"; do
    [ -f "$side/$h" ] || { echo "group_norm_ab.sh: no $h in $side" >&2; exit 2; }
  done
done
cxx=${CXX:-g++}
flags=(-O3 -std=c++17 -mavx2 -mfma -mf16c -fopenmp)
inc=(-Iops/group_norm -Icpp -Icpp/include)
"$cxx" "${flags[@]}" -DGN_AB_SIDE=a -I"$a" "${inc[@]}" -c benchmarks/cpp/group_norm_ab_side.cpp -o "$out/a.o" &
pa=$!
"$cxx" "${flags[@]}" -DGN_AB_SIDE=b -I"$b" "${inc[@]}" -c benchmarks/cpp/group_norm_ab_side.cpp -o "$out/b.o" &
pb=$!
"$cxx" "${flags[@]}" "${inc[@]}" -c benchmarks/cpp/group_norm_ab.cpp -o "$out/main.o"
wait "$pa"
wait "$pb"
"$cxx" -fopenmp "$out/main.o" "$out/a.o" "$out/b.o" "$pkg/lib/libopbridge_kernels.a" -o "$out/gn_ab"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_PROC_BIND=${OMP_PROC_BIND:-close} exec "$out/gn_ab" "$@"
