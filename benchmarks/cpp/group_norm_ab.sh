#!/usr/bin/env bash
# GroupNorm's forward kernel before and after a change, side by side in one process
# (group_norm_ab.cpp says what it times and prints). From anywhere in the repository, with opbridge
# installed from it (the program takes the library's cache choices):
#   benchmarks/cpp/group_norm_ab.sh [--rounds R] [--groups G] [--nchw] [--silu] [--fresh] [--backward] N,C,H,W ...
# A: ops/group_norm/group_norm_simd.h and group_norm_backward_simd.h at GN_AB_A, a git revision
# (default HEAD) or a folder holding both; B: the ones in the folder GN_AB_B (default: the working
# tree's ops/group_norm). The other headers are the working tree's. The program is built in GN_AB_OUT
# (default: a new temporary folder) and runs with OMP_NUM_THREADS=2 OMP_PROC_BIND=close unless
# they are set. Both sides are built for AVX2 (needs g++ or $CXX and a CPU with AVX2 and FMA), or
# for AVX-512 with GN_AB_ISA=avx512 (the set the library runs where the CPU has it, as Intel Xeons
# do). Exit status: the program's (1 where A's and B's outputs differ, 2 on bad arguments).
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
case ${GN_AB_ISA:-avx2} in
  avx2) ;;
  avx512)
    grep -qw avx512bw /proc/cpuinfo || { echo "group_norm_ab.sh: GN_AB_ISA=avx512, but this CPU has no AVX-512" >&2; exit 2; }
    flags+=(-mavx512f -mavx512bw -mavx512vl -mavx512dq) ;;
  *) echo "group_norm_ab.sh: GN_AB_ISA must be avx2 or avx512, got '$GN_AB_ISA'" >&2; exit 2 ;;
esac
inc=(-Iops/group_norm -Icpp -Icpp/include)
# Each object is kept in GN_AB_OUT under a hash of what it is built from (compiler, flags, its
# sources and every header of the working tree it may include), so that later runs with the
# same headers rebuild nothing: only a changed side is compiled again.
common=$( { "$cxx" --version; echo "${flags[*]}"; cat ops/group_norm/*.h cpp/common/*.h cpp/include/opbridge/*.h \
  benchmarks/cpp/*.h; } | sha256sum | cut -c1-16)
object() {  # object NAME SOURCE [OPTION ...]: the path $out/NAME-<hash>.o of that build
  local name=$1 src=$2; shift 2
  local key
  key=$( { echo "$common $*"; cat "$src"; for o in "$@"; do [ "${o#-I}" = "$o" ] || cat "${o#-I}"/*.h; done; } \
    | sha256sum | cut -c1-16)
  echo "$out/$name-$key.o"
}
compile() {  # compile OBJECT SOURCE [OPTION ...], unless OBJECT is kept from an earlier run
  local obj=$1 src=$2; shift 2
  [ -f "$obj" ] || { "$cxx" "${flags[@]}" "$@" "${inc[@]}" -c "$src" -o "$obj.tmp" && mv "$obj.tmp" "$obj"; }
}
side=benchmarks/cpp/group_norm_ab_side.cpp
oa=$(object a "$side" -DGN_AB_SIDE=a -I"$a")
ob=$(object b "$side" -DGN_AB_SIDE=b -I"$b")
om=$(object main benchmarks/cpp/group_norm_ab.cpp)
compile "$oa" "$side" -DGN_AB_SIDE=a -I"$a" &
pa=$!
compile "$ob" "$side" -DGN_AB_SIDE=b -I"$b" &
pb=$!
compile "$om" benchmarks/cpp/group_norm_ab.cpp
wait "$pa"
wait "$pb"
"$cxx" -fopenmp "$om" "$oa" "$ob" "$pkg/lib/libopbridge_kernels.a" -o "$out/gn_ab"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_PROC_BIND=${OMP_PROC_BIND:-close} exec "$out/gn_ab" "$@"
