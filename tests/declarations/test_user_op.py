"""Ops of your own on opbridge: examples/user_op (LogCumSumExp, which ONNX lacks, declared once in
C++) is built with CMake against the installed package (find_package + opbridge_add_op), then used
from torch, exported with both exporters (rules derived from its declaration) and run in ONNX
Runtime next to opbridge's own ops; opbridge.testing.check_op checks it end to end. The legacy
Python-only opbridge.onnx.declare_op keeps working. References are float64 numpy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import opbridge
from helpers import reference
from helpers.cmake_helpers import REPO, build, configure, require_toolchain, run
from helpers.onnx_models import single_node_model

torch = pytest.importorskip("torch", reason="the example op is a torch op")
import onnxruntime as ort  # noqa: E402

import opbridge.onnx  # noqa: E402
import opbridge.ops  # noqa: E402
import opbridge.testing  # noqa: E402

EXAMPLE = REPO / "examples" / "user_op"
DOMAIN = "com.example.userops"


@pytest.fixture(scope="module")
def userops(tmp_path_factory):
    """The example, configured against the installed opbridge, built, installed, imported."""
    if not opbridge.build_info().get("torch_version"):
        pytest.skip("opbridge was built without torch: no torch adapter to build the example's torch op with")
    root = tmp_path_factory.mktemp("user_op")
    configure(EXAMPLE, root / "build", {"opbridge_DIR": opbridge.cmake_dir()})
    build(root / "build")
    run([require_toolchain(), "--install", root / "build", "--prefix", root / "prefix"])
    sys.path.insert(0, str(root / "prefix"))
    try:
        import userops
        import userops.ops  # noqa: F401  (the torch side: extension, fake kernel)
    finally:
        sys.path.remove(str(root / "prefix"))
    return userops


def lcse(x: np.ndarray, axis: int) -> np.ndarray:
    """float64 reference: log(cumsum(exp(x))) along axis, by numpy's stable logaddexp."""
    return np.logaddexp.accumulate(np.asarray(x, dtype=np.float64), axis=axis)


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12)}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])


@DTYPES
@pytest.mark.parametrize("shape,dim", [((7,), 0), ((4, 9), -1), ((3, 5, 6), 1), ((2, 3, 4, 5), 0)])
def test_torch_matches_reference(userops, rng, dtype, shape, dim):
    # Values up to ~+-120: exp() of them overflows float32, the op must not.
    x = torch.from_numpy(rng.standard_normal(shape) * 40).to(dtype)
    y = userops.log_cumsum_exp(x, dim)
    assert y.dtype == dtype and y.shape == x.shape
    np.testing.assert_allclose(y.numpy(), lcse(x.numpy(), dim), **TOL[dtype])


def test_torch_non_contiguous_and_special_values(userops, rng):
    x = torch.from_numpy(rng.standard_normal((6, 8)) * 5).t()  # non-contiguous view
    np.testing.assert_allclose(userops.log_cumsum_exp(x, 1).numpy(), lcse(x.numpy(), 1), rtol=1e-12, atol=1e-12)
    inf = np.inf
    s = torch.tensor([[-inf, -inf, 0.0, 1000.0, -1000.0, inf, 3.0, inf],
                      [-inf, 2.0, -inf, -inf, 5.0, 5.0, -2.0, 1.0]], dtype=torch.float64)
    np.testing.assert_allclose(userops.log_cumsum_exp(s, 1).numpy(), lcse(s.numpy(), 1), rtol=1e-12, atol=0)
    nan_in = torch.tensor([1.0, float("nan"), 2.0])
    assert torch.isnan(userops.log_cumsum_exp(nan_in, 0)[1:]).all()


def test_torch_rejects_bad_input(userops):
    with pytest.raises(ValueError, match=r"dim must be in \[-2, 2\).*got 2"):
        userops.log_cumsum_exp(torch.ones(2, 3), 2)
    with pytest.raises(ValueError, match="rank >= 1"):
        userops.log_cumsum_exp(torch.tensor(1.0), 0)
    with pytest.raises(TypeError, match="float32 or float64"):
        userops.log_cumsum_exp(torch.ones(2, 3, dtype=torch.int64), 0)


def test_check_op(userops, rng):
    # The reference takes the sample's float64 tensors; no gradient formula: gradcheck is skipped.
    report = opbridge.testing.check_op(
        "userops::log_cumsum_exp", lambda x, dim: lcse(x.numpy(), dim),
        [(torch.randn(3, 5) * 40, 1), (torch.randn(2, 3, 4), 0), (torch.randn(6), -1)])
    assert any(c.name == "gradcheck" and c.status == "skip" for c in report.checks)


def test_backward_is_a_clear_error(userops):
    x = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(NotImplementedError, match="userops::log_cumsum_exp has no gradient formula"):
        userops.log_cumsum_exp(x, 1).sum().backward()


def test_fake_kernel_from_the_declaration(userops):
    # torch.export needs the fake kernel; its checks are the C++ ones.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        y = torch.ops.userops.log_cumsum_exp(torch.empty(2, 5), -1)
        assert y.shape == (2, 5)
        with pytest.raises(ValueError, match=r"userops::log_cumsum_exp: dim must be in \[-2, 2\)"):
            torch.ops.userops.log_cumsum_exp(torch.empty(2, 5), 2)


def test_ort_library_exports_only_the_entry_points(userops):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", userops.get_library_path()], capture_output=True, text=True,
                         check=True).stdout
    # RegisterCustomOps for ORT; opbridge's C ABI (opbridge/c_abi.h): the declarations, their
    # checks and the CPU compute functions on arrays for Python (opbridge/_c_abi.py), its layout for
    # the ctypes side, the declarations' errors for the build's check.
    assert sorted(line.split()[-1] for line in out.splitlines() if line.strip()) == [
        "OpbridgeAbiLayout", "OpbridgeCheckCall", "OpbridgeDeclarationErrors", "OpbridgeDescribeOps",
        "OpbridgeRunHost", "RegisterCustomOps"]


class Model(torch.nn.Module):
    """Standard ops, the user's op and one of opbridge's, in one graph."""

    def __init__(self, userops):
        super().__init__()
        self.userops = userops

    def forward(self, x):
        y = self.userops.log_cumsum_exp(x * 0.5, 2)
        return opbridge.ops.group_norm(y, 2, None, None, 1e-5) + 1.0


@DTYPES
@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_export_and_run_in_ort(userops, tmp_path, rng, dynamo, dtype):
    model = Model(userops).eval()
    x = torch.from_numpy(rng.standard_normal((2, 4, 7)) * 30).to(dtype)
    proto = opbridge.onnx.export(model, (x,), tmp_path / "m.onnx", dynamo=dynamo)
    nodes = [n for n in proto.graph.node if n.domain == DOMAIN]
    assert [n.op_type for n in nodes] == ["LogCumSumExp"]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in nodes[0].attribute} == {"axis": 2}
    assert {o.domain: o.version for o in proto.opset_import}[DOMAIN] == 1
    assert any(n.domain == opbridge.DOMAIN and n.op_type == "GroupNorm" for n in proto.graph.node)

    sess = ort.InferenceSession(proto.SerializeToString(), userops.session_options(),
                                providers=["CPUExecutionProvider"])
    # Another batch size than the export's: the batch dimension is dynamic.
    x2 = rng.standard_normal((3, 4, 7)) * 30
    x2 = x2.astype(np.float32 if dtype == torch.float32 else np.float64)
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x2})
    # ONNX float attributes are float32: the exported GroupNorm's epsilon is float32(1e-5). In
    # float64 that difference shows where a group's variance is small (var 0.018 moves the
    # result by ~7e-12), so the reference uses the epsilon the model carries.
    expected = reference.group_norm(lcse(x2 * 0.5, 2), 2, eps=float(np.float32(1e-5))) + 1.0
    np.testing.assert_allclose(got, expected, **({"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32
                                                 else TOL[dtype]))
    with torch.no_grad():
        np.testing.assert_allclose(got, model(torch.from_numpy(x2)).numpy(), rtol=1e-5, atol=1e-5)


def test_ort_reports_bad_axis(userops, rng):
    m = single_node_model("LogCumSumExp", DOMAIN, [("X", np.float32, [2, 3])], {"axis": 5})
    sess = ort.InferenceSession(m.SerializeToString(), userops.session_options(), providers=["CPUExecutionProvider"])
    # The declaration's one message (it names the argument as torch does: dim = ONNX axis).
    with pytest.raises(Exception, match=r"com\.example\.userops::LogCumSumExp.*dim must be in \[-2, 2\)"):
        sess.run(None, {"X": rng.standard_normal((2, 3)).astype(np.float32)})


def test_unknown_attribute_is_caught_where_the_node_is_visible(userops):
    # ORT cannot list a node's attributes: its kernel reads `axis` and never sees `reverse`.
    # opbridge.InferenceSession and onnx.checker (through the OpSchema from the declaration) do.
    m = single_node_model("LogCumSumExp", DOMAIN, [("X", np.float32, [2, 3])], {"axis": 1, "reverse": 1})
    with pytest.raises(ValueError, match=r"LogCumSumExp: unknown attribute 'reverse'; LogCumSumExp has axis"):
        opbridge.InferenceSession(m)
    for d in (2, 3):  # the checker wants the output's shape
        m.graph.output[0].type.tensor_type.shape.dim.add().dim_value = d
    with pytest.raises(onnx.checker.ValidationError, match="Unrecognized attribute: reverse"):
        onnx.checker.check_model(m)
    assert opbridge.onnx.check_attributes(m)


def test_ort_requires_the_axis_attribute(userops):
    m = single_node_model("LogCumSumExp", DOMAIN, [("X", np.float32, [2, 3])])
    with pytest.raises(Exception, match="axis"):
        ort.InferenceSession(m.SerializeToString(), userops.session_options(), providers=["CPUExecutionProvider"])


# ---- the legacy Python-only declaration helper (uses opbridge's own torch op; no build) -----
def test_declare_op_derives_schema_from_torch():
    decl = opbridge.onnx.declare_op("opbridge::group_norm", domain="com.example.test", op_type="GN",
                                    attributes={"num_groups": "groups"}, register=False)
    schema = decl.schema()
    assert (schema.name, schema.domain, schema.since_version) == ("GN", "com.example.test", 1)
    assert [i.name for i in schema.inputs] == ["x", "weight", "bias"]
    opt = onnx.defs.OpSchema.FormalParameterOption.Optional
    assert [i.option == opt for i in schema.inputs] == [False, True, True]
    assert schema.attributes["groups"].required and schema.attributes["groups"].type == onnx.defs.OpSchema.AttrType.INT
    assert onnx.helper.get_attribute_value(schema.attributes["eps"].default_value) == pytest.approx(1e-5)
    assert decl.opset_imports == {"com.example.test": 1}
    assert "opbridge::group_norm" not in [getattr(m, "torch_op", None) for m in opbridge.onnx._registry.rule_sets()]


@pytest.mark.parametrize("kwargs,match", [
    (dict(torch_op="opbridge::no_such_op"), "does not exist"),
    (dict(torch_op="group_norm"), "namespace::op_name"),
    (dict(domain=opbridge.DOMAIN), "your own ORT library"),
    (dict(attributes={"no_such_arg": "a"}), "does not have"),
    (dict(attributes={"x": "X"}), "tensor argument"),
    (dict(output_like=3), "output_like"),
])
def test_declare_op_rejects_bad_declarations(kwargs, match):
    args = dict(torch_op="opbridge::group_norm", domain="com.example.test", op_type="GN", register=False)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        opbridge.onnx.declare_op(args.pop("torch_op"), **args)


# ---- CUDA ------------------------------------------------------------------------------------
def _nvcc():
    default = Path("/usr/local/cuda/bin/nvcc")  # where CUDA installs it, often not on PATH
    return shutil.which("nvcc") or (str(default) if default.exists() else None)


@pytest.fixture(scope="module")
def userops_cuda_build(tmp_path_factory):
    """The example with USEROPS_WITH_CUDA=ON (the CUDA compute function compiled in): the ORT library."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("no nvcc: the CUDA sources cannot be compiled here")
    root = tmp_path_factory.mktemp("user_op_cuda")
    defines = {"opbridge_DIR": opbridge.cmake_dir(), "USEROPS_WITH_CUDA": "ON", "CMAKE_CUDA_COMPILER": nvcc}
    if torch.cuda.is_available():
        defines["CMAKE_CUDA_ARCHITECTURES"] = "native"
    else:
        defines["CMAKE_CUDA_ARCHITECTURES"] = "90"  # any one architecture nvcc knows: only compiled here
    configure(EXAMPLE, root, defines)
    build(root, "--target", "userops_ort")
    return root / "libuserops_ort.so"


@pytest.mark.slow
def test_cuda_sources_build_and_cpu_still_runs(userops_cuda_build, rng):
    # With CUDA compiled in (cudart static), the library still loads and runs on a CPU-only host.
    m = single_node_model("LogCumSumExp", DOMAIN, [("X", np.float64, [3, 9])], {"axis": -1})
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(userops_cuda_build))
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((3, 9)) * 40
    np.testing.assert_allclose(sess.run(None, {"X": x})[0], lcse(x, -1), rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
def test_cuda_kernel_in_ort(userops_cuda_build, rng):
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
    m = single_node_model("LogCumSumExp", DOMAIN, [("X", np.float32, [4, 300, 5])], {"axis": 1})
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(userops_cuda_build))
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")  # the CUDA kernel or nothing
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CUDAExecutionProvider"])
    x = (rng.standard_normal((4, 300, 5)) * 40).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"X": x})[0], lcse(x, 1), rtol=1e-4, atol=1e-4)
