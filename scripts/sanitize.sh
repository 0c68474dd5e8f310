#!/usr/bin/env bash
# Builds opbridge with AddressSanitizer + UndefinedBehaviorSanitizer and runs the test suite
# against that build.
#
#   scripts/sanitize.sh [--ort-only] [--fuzz N] [-- pytest args...]
#
#   --ort-only   build without the torch extension and run only the torch-free tests (the ORT
#                library and the numpy kernel module); what CI runs
#   --fuzz N     also run N fuzz cases per op and kind under the sanitizers (default 0)
#
# CPU code only (OPBRIDGE_WITH_CUDA=OFF): the CUDA kernels need a GPU to run, and nvcc's device
# code is not instrumented anyway.
# The sanitized package is installed with `pip install --target build/sanitize/site` (its own
# build dir build/sanitize/<tag>, so the normal build is untouched) and put first on PYTHONPATH.
# Python itself is not instrumented, so libasan is preloaded. Any ASan or UBSan report aborts the
# process, which fails the run. With --ort-only, LeakSanitizer is on, limited to opbridge's leaks:
# the interpreter, numpy and ORT leave memory behind on purpose, so instead of LSan's at-exit check
# the pytest process (at the end of the session) and the fuzz workers (when closed) ask for a report
# and keep the leaks whose allocation stack passes through opbridge's native code (tests/helpers/lsan.py);
# any such leak fails the run. Not leak-checked: processes that tests start with subprocess.run, and
# the full run with the torch extension (LSan there has not been validated against torch's own
# intentional leaks and registries; tests/reliability/test_leaks.py's RSS checks cover the torch op).
# Needs the environment the normal tests need (requirements/test.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

ort_only=0
fuzz=0
pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ort-only) ort_only=1 ;;
    --fuzz) fuzz="$2"; shift ;;
    --) shift; pytest_args=("$@"); break ;;
    *) echo "usage: $0 [--ort-only] [--fuzz N] [-- pytest args...]" >&2; exit 2 ;;
  esac
  shift
done

PYTHON=${PYTHON:-python}
site=build/sanitize/site
with_torch=ON
[ "$ort_only" = 1 ] && with_torch=OFF
start=$(date +%s)

echo "::: building the ASan + UBSan package into $site (torch extension: $with_torch)"
"$PYTHON" -m pip install --no-build-isolation --no-deps --upgrade -q --target "$site" \
  -C build-dir="build/sanitize/{wheel_tag}" \
  -C cmake.define.OPBRIDGE_SANITIZE=ON -C install.strip=false \
  -C cmake.define.OPBRIDGE_WITH_TORCH="$with_torch" \
  -C cmake.define.OPBRIDGE_WITH_CUDA=OFF \
  .
built=$(date +%s)
echo "::: build took $((built - start)) s"

libasan=$(${CXX:-g++} -print-file-name=libasan.so)
libstdcxx=$(${CXX:-g++} -print-file-name=libstdc++.so.6)
for lib in "$libasan" "$libstdcxx"; do
  if [ ! -e "$lib" ]; then
    echo "sanitize: $lib not found (asked ${CXX:-g++} -print-file-name)" >&2
    exit 1
  fi
done
# libstdc++ is preloaded too: python does not link it, and ASan's __cxa_throw interceptor must
# find the real one when it starts ("CHECK failed: real___cxa_throw != 0" on the first throw).
export LD_PRELOAD="$libasan $libstdcxx"
# alloc_dealloc_mismatch=0: libraries built without ASan (torch) allocate with one operator and free
# with another legitimately through their own wrappers.
asan_options="alloc_dealloc_mismatch=0:abort_on_error=1:print_summary=1:strict_string_checks=1"
if [ "$ort_only" = 1 ]; then
  # detect_leaks=1:leak_check_at_exit=0: LSan's bookkeeping on, its fatal at-exit check off (see
  # above; tests/helpers/lsan.py runs the check, found as a plugin on the tests/ path).
  export ASAN_OPTIONS="detect_leaks=1:leak_check_at_exit=0:$asan_options"
  # Every Python object from malloc: LSan scans malloc'd memory for pointers, but not pymalloc's
  # mmap'd arenas, so live memory referenced only from Python objects would look leaked.
  export PYTHONMALLOC=malloc
  export OPBRIDGE_LSAN_DIR="$PWD/build/sanitize/lsan"
  rm -rf "$OPBRIDGE_LSAN_DIR"
else
  export ASAN_OPTIONS="detect_leaks=0:$asan_options"
fi
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export PYTHONPATH="$PWD/$site:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"

# The tests must see the sanitized build, not the normally installed one.
"$PYTHON" - <<'PY'
import os, opbridge
lib = opbridge.get_library_path()
assert "build/sanitize/site" in lib, f"tests would load {lib}, not the sanitized build"
with open(lib, "rb") as f:
    assert b"__asan_init" in f.read(), f"{lib} is not built with AddressSanitizer"
print(f"::: testing {os.path.dirname(lib)}")
PY

if [ "$ort_only" = 1 ]; then
  # -m "not torch": torch may be installed, but this build has no torch extension.
  # Every instruction-set variant of the kernels runs through _core (test_group_norm_isa.py,
  # test_inverse.py's and test_ort_inverse.py's isa parameters).
  tests=(-m "not torch" tests/ops/test_group_norm_ort.py tests/ort/test_ort_*.py tests/ops/test_ort_inverse.py tests/cli/test_check.py tests/core/test_core.py
         tests/reliability/test_fuzz_ort.py tests/reliability/test_concurrency.py tests/reliability/test_leaks.py tests/ops/test_group_norm_edge_cases.py
         tests/ops/test_inverse.py tests/ops/test_inverse_edge_cases.py tests/ops/test_group_norm_isa.py tests/ops/test_ms_deform_attn.py
         tests/ops/test_ms_deform_attn_errors.py)
  kinds=ort
else
  # test_cuda.py runs nvcc, which crashes with libasan preloaded (and this build has no CUDA).
  tests=(tests --ignore=tests/cuda_ops/test_cuda.py)
  kinds=all
fi
# The fuzz subset's worker processes inherit LD_PRELOAD and the options.
"$PYTHON" -m pytest -q -p no:cacheprovider -p helpers.lsan "${tests[@]}" ${pytest_args[@]+"${pytest_args[@]}"}
if [ "$fuzz" -gt 0 ]; then
  "$PYTHON" -m tests.fuzz.run --cases "$fuzz" --kind "$kinds" --out build/sanitize/fuzz-failures
  # The fuzz workers' leak reports (the pytest run checked its own).
  if [ "$ort_only" = 1 ] && compgen -G "$OPBRIDGE_LSAN_DIR/leaks.*.txt" > /dev/null; then
    echo "LeakSanitizer: opbridge code leaked memory during fuzzing:" >&2
    cat "$OPBRIDGE_LSAN_DIR"/leaks.*.txt >&2
    exit 1
  fi
fi
echo "::: sanitizers clean; build $((built - start)) s, tests $(( $(date +%s) - built )) s"
