#!/usr/bin/env bash
# Runs opbridge's torch-side tests against several torch releases with ONE built wheel: the torch
# extension is built once, on the LibTorch stable ABI of torch 2.11, and the very same
# libopbridge_torch.so (checked by sha256) must pass in every torch from 2.11 on.
#
#   scripts/torch_matrix.sh [TORCH_VERSION ...]      default: 2.11.0 2.14.1
#
# 1. builds the wheel with the current (dev) Python: pip wheel --no-build-isolation (reuses build/);
# 2. per version (the versions side by side, each one's output printed when all are done): a venv
#    under $OPBRIDGE_TORCH_MATRIX_DIR/venv-<ver> (created once, then reused:
#    torch's CUDA builds bring 4-5 GB of nvidia-* wheels, which pip's own cache also keeps) with
#    torch==<ver>, numpy, onnx, onnxscript, onnxruntime, pytest, hypothesis and the wheel (--no-deps);
#    torch 2.11 with the `export` extra's floors of onnx, onnxscript and onnx-ir (scripts/extra_floors.py);
#    checks that the installed libopbridge_torch.so is byte for byte the built one;
#    the same for a user's op project, examples/rms_norm (opbridge new-op's layout), built once;
# 3. runs the torch-side test modules there, and the project's own tests, with no compiler on PATH (only the venv's bin/ and a
#    folder of a few shell tools and binutils): tests that build C++ skip themselves, nothing is compiled.
# Environment: PYTHON (dev interpreter, default: python), OPBRIDGE_TORCH_MATRIX_DIR (cache, default
# $HOME/.cache/opbridge-torch-matrix: outside the clone, so that CI runs on one machine share it).
# Exit status: non-zero when any version fails.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=${PYTHON:-python}
cache=${OPBRIDGE_TORCH_MATRIX_DIR:-$HOME/.cache/opbridge-torch-matrix}
if [ $# -gt 0 ]; then versions=("$@"); else versions=(2.11.0 2.14.1); fi
# The torch side, minus what needs a compiler (CMake consumers, users' ops), real models
# (transformers / diffusers) and CUDA.
tests=(tests/install/test_stable_abi.py tests/install/test_torch_import.py tests/ops/test_group_norm.py tests/ops/test_group_norm_backward.py
       tests/ops/test_group_norm_edge_cases.py tests/ops/test_group_norm_layouts.py tests/ops/test_inverse.py
       tests/ops/test_inverse_on_singular.py tests/ops/test_ms_deform_attn.py tests/ops/test_ms_deform_attn_errors.py
       tests/core/test_no_grad_fast_path.py tests/export/test_export_dynamic.py tests/declarations/test_testing.py tests/ops/test_nn_dropins.py)
mkdir -p "$cache"
t_start=$SECONDS

echo "== building the wheel"
rm -rf "$cache/dist"
"$py" -m pip wheel --no-build-isolation --no-deps -q -w "$cache/dist" .
wheel=$(ls "$cache"/dist/opbridge-*.whl)
built=$("$py" - "$wheel" <<'PY'
import hashlib, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
print(hashlib.sha256(z.read("opbridge/libopbridge_torch.so")).hexdigest())
PY
)
echo "   $(basename "$wheel"), libopbridge_torch.so sha256 $built ($((SECONDS - t_start)) s)"
# A user's project, built once against the dev environment's torch and opbridge.
"$py" -m pip wheel --no-build-isolation --no-deps -q -w "$cache/dist" examples/rms_norm
user_wheel=$(ls "$cache"/dist/myops-*.whl)
user_built=$("$py" - "$user_wheel" <<'PY'
import hashlib, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
print(hashlib.sha256(z.read(next(n for n in z.namelist() if n.endswith("_torch.so")))).hexdigest())
PY
)
echo "   $(basename "$user_wheel"), its torch library sha256 $user_built ($((SECONDS - t_start)) s)"

# A PATH without compilers: the venv's bin/ and these tools only.
tools="$cache/tools"
rm -rf "$tools"
mkdir -p "$tools"
for t in sh bash env uname cat ls rm mkdir cp mv sed grep tr head tail date lscpu nproc nm readelf strip; do
  p=$(command -v "$t" || true)
  [ -n "$p" ] && ln -s "$p" "$tools/$t"
done

# One version's check, its output to $cache/log-<ver>, its verdict to $cache/result-<ver>.
check_version() {
  local v=$1 venv="$cache/venv-$1" t0=$SECONDS
  if [ ! -f "$venv/.ready" ]; then
    echo "== creating $venv"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q "torch==$v" numpy onnx onnxscript onnxruntime pytest hypothesis expecttest
    touch "$venv/.ready"
  fi
  # The oldest torch runs with the oldest onnx, onnxscript and onnx-ir the `export` extra allows
  # (its floors, exact); the others keep the newest.
  case "$v" in
    # shellcheck disable=SC2046  # several requirement specs
    2.11.*) "$venv/bin/python" -m pip install -q $("$py" scripts/extra_floors.py export --skip torch) ;;
  esac
  "$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$wheel"
  # The user's project in a folder of its own (PYTHONPATH for its tests only): installed in the
  # venv, its entry point would make opbridge's torch-free tests import it, and torch with it.
  "$venv/bin/python" -m pip uninstall -q -y myops > /dev/null 2>&1 || true
  rm -rf "$cache/user-$v"
  "$venv/bin/python" -m pip install -q --no-deps --target "$cache/user-$v" "$user_wheel"
  local got user_got
  got=$("$venv/bin/python" -c "import hashlib, opbridge; print(hashlib.sha256(open(opbridge.torch_library_path(), 'rb').read()).hexdigest())")
  echo "== torch $v ($("$venv/bin/python" -c 'import importlib.metadata as m, torch; print(", ".join([torch.__version__] + [f"{d} {m.version(d)}" for d in ("onnx", "onnxscript", "onnx-ir")]))')), libopbridge_torch.so sha256 $got"
  user_got=$(sha256sum "$cache/user-$v"/myops/*_torch.so | cut -d' ' -f1)
  if [ "$got" != "$built" ] || [ "$user_got" != "$user_built" ]; then
    echo "FAILED (installed library differs from the built one)" > "$cache/result-$v"
    return 1
  fi
  if env PATH="$venv/bin:$tools" OPBRIDGE_EXPECT_TORCH="$v" "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "${tests[@]}" \
     && (cd examples/rms_norm && env PATH="$venv/bin:$tools" PYTHONPATH="$cache/user-$v" \
           "$venv/bin/python" -m pytest -q -p no:cacheprovider tests); then
    echo "passed ($((SECONDS - t0)) s)" > "$cache/result-$v"
  else
    echo "FAILED ($((SECONDS - t0)) s)" > "$cache/result-$v"
    return 1
  fi
}

# The versions side by side, each in a process tree of its own (their venvs, user-op folders and
# logs are separate; the tests write only under pytest's temporary folders): most of a version's
# time is one Python process importing and exporting, so two versions on two cores take little
# longer than one. Their logs are printed one after the other once all are done.
pids=()
for v in "${versions[@]}"; do
  rm -f "$cache/result-$v"
  (check_version "$v") > "$cache/log-$v" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || true; done
declare -A result
status=0
for v in "${versions[@]}"; do
  cat "$cache/log-$v"
  result[$v]=$(cat "$cache/result-$v" 2>/dev/null || echo "FAILED (no verdict: see the log above)")
  case "${result[$v]}" in passed*) ;; *) status=1 ;; esac
done

echo "== torch matrix (one libopbridge_torch.so, sha256 ${built:0:16}...; $((SECONDS - t_start)) s; cache $cache: $(du -sh "$cache" | cut -f1))"
for v in "${versions[@]}"; do
  echo "   torch $v: ${result[$v]}"
done
exit $status
