#!/usr/bin/env bash
# Installs the distributable wheel as users of either ONNX Runtime distribution would, and checks
# that opbridge never replaces the one they have. No GPU needed.
#
#   scripts/ortgpu_install_check.sh [WHEEL]    default: dist/opbridge-*-manylinux*.whl (scripts/build_wheel.sh)
#
# 1. tools: a torch-free venv gets "WHEEL[tools,onnxruntime]" (binary wheels only). torch must not be
#    installed; a standard GroupNormalization-21 model goes through `opbridge check`, `opbridge
#    optimize` (rewritten into ai.opbridge::GroupNorm and checked against the original in ONNX
#    Runtime) and `opbridge check` of the result.
# 2. gpu: a venv with onnxruntime-gpu==$ORTGPU_VERSION (1.31.1, built for CUDA 13; its provider list
#    names CUDAExecutionProvider without a GPU) gets "WHEEL[onnxruntime-gpu]". Afterwards
#    CUDAExecutionProvider is still listed, no `onnxruntime` distribution sits beside
#    onnxruntime-gpu (importlib.metadata), and the optimized model runs with our library on the CPU
#    provider, compared with a float64 reference.
# The venvs are kept in $OPBRIDGE_ORTGPU_DIR (default $HOME/.cache/opbridge-ortgpu: onnxruntime-gpu
# is a 256 MB wheel) and made again when the wheel's requirements change; opbridge itself is
# reinstalled from WHEEL every run, its dependencies resolved by pip as a user's install would.
# Environment: PYTHON (creates the venvs; default: python3), ORTGPU_VERSION, OPBRIDGE_ORTGPU_DIR.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [ $# -gt 0 ]; then
  wheel=$1
else
  wheel=$(ls -t dist/opbridge-*-manylinux*.whl 2>/dev/null | head -1 || true)
fi
if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
  echo "ortgpu_install_check.sh: no wheel given and none in dist/ (run scripts/build_wheel.sh)" >&2
  exit 2
fi
wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
ortgpu=${ORTGPU_VERSION:-1.31.1}
cache=${OPBRIDGE_ORTGPU_DIR:-$HOME/.cache/opbridge-ortgpu}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$cache"
t_start=$SECONDS

# The wheel's Requires-Dist: a cached venv made for other requirements is made again, so that a
# requirement dropped from the wheel cannot hide behind a package an older venv still has.
requires=$(python3 - "$wheel" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
print(";".join(sorted(l for l in meta.splitlines() if l.startswith("Requires-Dist:"))))
PY
)

# venv NAME EXTRAS [PACKAGE ...]: $cache/NAME with PACKAGEs, then opbridge from the wheel with EXTRAS.
venv() {
  local name=$1 extras=$2 dir=$cache/$1
  shift 2
  local key="$* | $requires"
  if [ "$(cat "$dir/.ready" 2>/dev/null || true)" != "$key" ]; then
    echo "== creating $dir${*:+: $*}"
    rm -rf "$dir"
    "${PYTHON:-python3}" -m venv "$dir"
    if [ $# -gt 0 ]; then
      "$dir/bin/python" -m pip install -q --only-binary :all: "$@" > "$work/pip-$name.log" 2>&1 \
        || { cat "$work/pip-$name.log"; exit 1; }
    fi
    echo "$key" > "$dir/.ready"
  fi
  "$dir/bin/python" -m pip uninstall -q -y opbridge > /dev/null 2>&1 || true
  if ! "$dir/bin/python" -m pip install -q --only-binary :all: "$wheel[$extras]" > "$work/pip-$name.log" 2>&1; then
    cat "$work/pip-$name.log"
    echo "ortgpu_install_check.sh: pip install $(basename "$wheel")[$extras] failed in $dir" >&2
    exit 1
  fi
}

echo "== torch-free: $(basename "$wheel")[tools,onnxruntime]"
t0=$SECONDS
venv tools tools,onnxruntime
tools=$cache/tools/bin
"$tools/python" - "$work/gn21.onnx" <<'PY'
import importlib.metadata as md, importlib.util, sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

assert importlib.util.find_spec("torch") is None, "torch was installed with opbridge[tools,onnxruntime]"
print("   " + ", ".join(f"{d} {md.version(d)}" for d in ("opbridge", "onnxruntime", "onnx", "onnxscript", "onnx-ir")))
# GroupNormalization-21 on (N, 8, 5, 6), 4 groups; scale and bias per channel, fixed so that a
# second process can compute the reference.
c = 8
rng = np.random.default_rng(21)
inits = [numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), "scale"),
         numpy_helper.from_array(rng.uniform(-0.5, 0.5, c).astype(np.float32), "bias")]
node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=4, epsilon=1e-5)
graph = helper.make_graph([node], "gn21", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", c, 5, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", c, 5, 6])], inits)
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), sys.argv[1])
PY
"$tools/opbridge" check "$work/gn21.onnx" > "$work/check.log" || { cat "$work/check.log"; exit 1; }
grep -q "ai.onnx::GroupNormalization x1" "$work/check.log" || { cat "$work/check.log"; exit 1; }
"$tools/opbridge" optimize "$work/gn21.onnx" "$work/gn.onnx" > "$work/optimize.log" \
  || { cat "$work/optimize.log"; exit 1; }
"$tools/opbridge" check "$work/gn.onnx" > "$work/check.log" || { cat "$work/check.log"; exit 1; }
grep -q "ai.opbridge::GroupNorm x1 *opbridge" "$work/check.log" || { cat "$work/check.log"; exit 1; }
echo "   opbridge check, optimize (GroupNormalization-21 -> ai.opbridge::GroupNorm), check: OK ($((SECONDS - t0)) s)"

echo "== onnxruntime-gpu $ortgpu: $(basename "$wheel")[onnxruntime-gpu]"
t0=$SECONDS
venv "ortgpu-$ortgpu" onnxruntime-gpu "onnxruntime-gpu==$ortgpu"
"$cache/ortgpu-$ortgpu/bin/python" - "$work/gn.onnx" "$ortgpu" <<'PY'
import importlib.metadata as md, sys

import numpy as np

model, version = sys.argv[1], sys.argv[2]
dists = sorted({d.metadata["Name"].lower() for d in md.distributions()} & {"onnxruntime", "onnxruntime-gpu"})
assert dists == ["onnxruntime-gpu"], f"ONNX Runtime distributions after installing opbridge: {dists}"
assert md.version("onnxruntime-gpu") == version, md.version("onnxruntime-gpu")
import onnxruntime as ort

import opbridge

providers = ort.get_available_providers()
assert "CUDAExecutionProvider" in providers, f"CUDAExecutionProvider is gone: {providers}"
print(f"   distributions: {', '.join(f'{d} {md.version(d)}' for d in dists)}; providers: {', '.join(providers)}")
print(f"   opbridge {opbridge.__version__} (cuda: {opbridge.build_info().get('cuda')}), {opbridge.get_library_path()}")

sess = opbridge.InferenceSession(model, providers=["CPUExecutionProvider"])
x = np.random.default_rng().standard_normal((3, 8, 5, 6)).astype(np.float32) * 2 + 1
(y,) = sess.run(None, {"x": x})
rng = np.random.default_rng(21)  # the model's scale and bias (the tools step above)
scale, bias = rng.uniform(0.5, 1.5, 8), rng.uniform(-0.5, 0.5, 8)
scale, bias = scale.astype(np.float32).astype(np.float64), bias.astype(np.float32).astype(np.float64)
g = x.astype(np.float64).reshape(3, 4, -1)
ref = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
ref = ref * scale[:, None, None] + bias[:, None, None]
err = float(np.abs(y - ref).max())
assert err < 1e-5, f"ai.opbridge::GroupNorm differs from the float64 reference by {err}"
print(f"   ai.opbridge::GroupNorm on CPUExecutionProvider: max |error| {err:.1e} against float64")
PY
echo "   OK ($((SECONDS - t0)) s)"
echo "== install checks passed ($((SECONDS - t_start)) s; cache $cache: $(du -sh "$cache" | cut -f1))"
