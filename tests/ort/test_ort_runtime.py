"""opbridge's ORT library on the installed onnxruntime: API negotiation, GroupNorm results, shape
inference, repeated registration.

ORT-only (onnxruntime, onnx, numpy; never torch): scripts/ort_matrix.sh runs this module against
several onnxruntime versions with one built library.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import opbridge
from helpers.onnx_models import IR_VERSION, single_node_model
from helpers.reference import group_norm as group_norm_ref

ORT_VERSION = tuple(int(p) for p in ort.__version__.split(".")[:2])
# ORT 1.17-1.23 crash building the shape-inference context of a custom op whose node omits an
# optional input, so the library gives ops with optional inputs (GroupNorm) shape inference on
# ORT >= 1.24 only (cpp/ort/register.cpp).
GROUP_NORM_SHAPE_INFERENCE = ORT_VERSION >= (1, 24)
TOL = {np.float32: 1e-5, np.float64: 1e-12, np.float16: 2e-2}

ORT_FAIL, ORT_NOT_IMPLEMENTED = 1, 9


def _session(model: onnx.ModelProto, so=None):
    return opbridge.InferenceSession(model, sess_options=so)


def _group_norm_model(x_shape, dtype=np.float32, scale=True, bias=True, num_groups=2, **attrs):
    c = x_shape[1]
    inputs = [("X", dtype, x_shape), ("scale", dtype, [c]) if scale else None, ("bias", dtype, [c]) if bias else None]
    while inputs[-1] is None:  # trailing omitted inputs are left out, middle ones stay ""
        inputs.pop()
    return single_node_model("GroupNorm", opbridge.DOMAIN, inputs, attrs={"num_groups": num_groups, **attrs})


# ---- API negotiation, against a fake runtime (no ORT involved) ----------------------------------

_GetApi = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)
_GetVersionString = ctypes.CFUNCTYPE(ctypes.c_void_p)
_CreateStatus = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)


class _ApiBase(ctypes.Structure):
    _fields_ = [("GetApi", _GetApi), ("GetVersionString", _GetVersionString)]


class FakeRuntime:
    """An OrtApiBase that reports `version`, records which API versions the library asks for, and
    serves only the API-1 table, whose first entry (CreateStatus) is all the error path needs."""

    STATUS = 0x5A7  # opaque OrtStatus* handed back to the library

    def __init__(self, version: str) -> None:
        self.requested: list[int] = []
        self.statuses: list[tuple[int, str]] = []
        self._version = ctypes.create_string_buffer(version.encode())
        self._create_status = _CreateStatus(self._on_create_status)
        self._api1 = (ctypes.c_void_p * 1)(ctypes.cast(self._create_status, ctypes.c_void_p).value)
        self.base = _ApiBase(_GetApi(self._on_get_api), _GetVersionString(lambda: ctypes.addressof(self._version)))

    def _on_get_api(self, version: int):
        self.requested.append(version)
        return ctypes.addressof(self._api1) if version == 1 else None

    def _on_create_status(self, code: int, message: bytes):
        self.statuses.append((code, message.decode()))
        return self.STATUS


@pytest.fixture
def fresh_library(tmp_path):
    """RegisterCustomOps of a private copy of the library: its own statics, not yet negotiated."""
    copy = tmp_path / "libopbridge_ort_copy.so"
    shutil.copy(opbridge.get_library_path(), copy)
    lib = ctypes.CDLL(str(copy))
    fn = lib.RegisterCustomOps
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return fn


def _compiled_api_version() -> int:
    version = opbridge.build_info().get("ort_api_version")
    if not version:
        pytest.skip("opbridge._core (build info) is not importable here")
    return int(version)


def _register(fn, runtime: FakeRuntime) -> int | None:
    # The error paths return before touching the options: any non-null pointer will do.
    return fn(ctypes.c_void_p(0x10), ctypes.byref(runtime.base))


@pytest.mark.parametrize("version", ["1.16.3", "1.9.0", "0.5.0", "nonsense"])
def test_older_runtime_is_refused_with_a_clear_message(fresh_library, version):
    rt = FakeRuntime(version)
    assert _register(fresh_library, rt) == FakeRuntime.STATUS
    assert rt.requested == [1], "only the API-1 table may be touched on an unsupported runtime"
    [(code, message)] = rt.statuses
    assert code == ORT_NOT_IMPLEMENTED
    assert "needs ONNX Runtime >= 1.17" in message and version in message


@pytest.mark.parametrize("version, expected", [
    ("1.17.3", 17),  # older than the headers: the runtime's own version
    ("1.23.2", 23),
    ("1.99.0", None),  # newer than the headers: the compiled version
    ("2.0.1", None),
])
def test_api_version_is_min_of_runtime_and_compiled(fresh_library, version, expected):
    compiled = _compiled_api_version()
    expected = min(expected, compiled) if expected else compiled
    rt = FakeRuntime(version)  # serves no table but API 1, so registration must stop with an error
    assert _register(fresh_library, rt) == FakeRuntime.STATUS
    assert rt.requested[0] == expected
    [(code, message)] = rt.statuses
    assert f"does not provide C API version {expected}" in message and version in message


# ---- the real runtime ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("scale, bias", [(True, True), (False, False), (False, True), (True, False)])
def test_group_norm_matches_reference(rng, dtype, scale, bias):
    shape = [3, 6, 4, 5]
    model = _group_norm_model(["N", 6, 4, 5], dtype, scale, bias, num_groups=3, epsilon=1e-3)
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    w = rng.uniform(0.5, 1.5, 6).astype(dtype)
    b = rng.uniform(-0.5, 0.5, 6).astype(dtype)
    feeds = {"X": x}
    if scale:
        feeds["scale"] = w
    if bias:
        feeds["bias"] = b
    (y,) = _session(model).run(None, feeds)
    # The epsilon attribute is a float32: the reference uses that same value.
    ref = group_norm_ref(x, 3, w if scale else None, b if bias else None, eps=float(np.float32(1e-3)))
    assert y.dtype == dtype and y.shape == x.shape
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=TOL[dtype], atol=TOL[dtype])


def test_registration_marks_the_options():
    # On this onnxruntime registration succeeds (on ORT older than the headers, through the
    # negotiated older API table) and marks the options, which makes a repeat a no-op.
    so = opbridge.session_options()
    assert so.get_session_config_entry("opbridge.custom_ops_registered.ai.opbridge") == "1"


def _chained_model(x_shape, num_groups=2, out_shape=None):
    """GroupNorm -> Relu, with no shape declared after X: ORT must infer it through GroupNorm."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)
    nodes = [
        helper.make_node("GroupNorm", ["X"], ["Y"], domain=opbridge.DOMAIN, num_groups=num_groups),
        helper.make_node("Relu", ["Y"], ["Z"]),
    ]
    graph = helper.make_graph(nodes, "chained", [x], [helper.make_tensor_value_info("Z", TensorProto.FLOAT, out_shape)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(opbridge.DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def test_ort_infers_output_shape_through_custom_node(rng):
    sess = _session(_chained_model(["N", 4, "H", 3]))
    (z,) = sess.run(None, {"X": rng.standard_normal((2, 4, 5, 3)).astype(np.float32)})
    assert z.shape == (2, 4, 5, 3)
    inferred = sess.get_outputs()[0]
    assert inferred.type == "tensor(float)"
    if GROUP_NORM_SHAPE_INFERENCE:
        assert inferred.shape == ["N", 4, "H", 3]
    else:
        # Type-only inference on runtimes where shape inference would crash (see module top).
        assert inferred.shape in (None, [])


def test_unknown_rank_input_is_not_taken_for_a_scalar(rng):
    # ORT reports an input of unknown rank as rank 0. Declaring the output a scalar there made
    # Flatten(axis=2) below reject the model at load.
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("GroupNorm", ["X"], ["Y"], domain=opbridge.DOMAIN, num_groups=2),
        helper.make_node("Flatten", ["Y"], ["Z"], axis=2),
    ]
    graph = helper.make_graph(nodes, "unknown_rank", [x], [helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(opbridge.DOMAIN, 1)],
                              ir_version=IR_VERSION)
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    (z,) = _session(model).run(None, {"X": x})
    np.testing.assert_allclose(z, group_norm_ref(x, 2).reshape(8, 3), rtol=1e-5, atol=1e-5)


def test_invalid_node_fails_with_the_kernel_message(rng):
    # Plain ORT loads it (its shape inference cannot refuse a model) and fails at run;
    # opbridge.InferenceSession refuses it at load, with the same message.
    import onnxruntime as ort

    message = "num_groups must divide the number of channels C = x.shape\\[1\\] = 4"
    model = _chained_model(["N", 4, 3], num_groups=3)
    sess = ort.InferenceSession(model.SerializeToString(), opbridge.session_options(),
                                providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match=message):
        sess.run(None, {"X": rng.standard_normal((2, 4, 3)).astype(np.float32)})
    with pytest.raises(ValueError, match="(?s)static shapes already fail.*" + message):
        _session(model)


@pytest.mark.parametrize("inputs", [["X", "", ""], ["X", "", "bias"], ["X", "scale", ""]])
def test_omitted_optional_inputs_load_on_every_runtime(rng, inputs):
    # Regression: with shape inference enabled, ORT 1.17-1.23 segfaulted loading these.
    x_info = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4, 3])]
    x_info += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in inputs[1:] if n]
    node = helper.make_node("GroupNorm", inputs, ["Y"], domain=opbridge.DOMAIN, num_groups=2)
    graph = helper.make_graph([node], "omitted", x_info, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(opbridge.DOMAIN, 1)],
                              ir_version=IR_VERSION)
    feeds = {"X": rng.standard_normal((2, 4, 3)).astype(np.float32)}
    params = {n: rng.uniform(0.5, 1.5, 4).astype(np.float32) for n in inputs[1:] if n}
    sess = _session(model)
    if GROUP_NORM_SHAPE_INFERENCE:  # the omitted inputs do not upset the op's shape inference
        assert sess.get_outputs()[0].shape == ["N", 4, 3]
    (y,) = sess.run(None, {**feeds, **params})
    ref = group_norm_ref(feeds["X"], 2, params.get("scale"), params.get("bias"))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


# ---- registering more than once -----------------------------------------------------------------

def test_registering_twice_on_one_options_is_a_no_op(rng):
    # Without the guard, ORT 1.31 refuses the session ("Domain already set in registry") and
    # older ORT may crash on the duplicate domain.
    so = ort.SessionOptions()
    so.register_custom_ops_library(opbridge.get_library_path())
    so.register_custom_ops_library(opbridge.get_library_path())
    opbridge.session_options(so)  # and a third time through the helper
    model = _group_norm_model(["N", 4, 3], scale=False, bias=False)
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    first = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    # Registering again after a session was built from the options changes nothing either.
    so.register_custom_ops_library(opbridge.get_library_path())
    second = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for sess in (first, second):
        np.testing.assert_allclose(sess.run(None, {"X": x})[0], group_norm_ref(x, 2), rtol=1e-5, atol=1e-5)


def test_many_sessions_each_with_the_library(rng):
    model = _group_norm_model(["N", 6, 5], scale=True, bias=True, num_groups=3)
    shared = opbridge.session_options()
    sessions = [_session(model) for _ in range(12)]
    sessions += [ort.InferenceSession(model.SerializeToString(), shared, providers=["CPUExecutionProvider"])
                 for _ in range(4)]
    for _ in range(2):  # interleaved runs, fresh inputs each time
        for sess in sessions:
            x = rng.standard_normal((3, 6, 5)).astype(np.float32)
            w = rng.uniform(0.5, 1.5, 6).astype(np.float32)
            b = rng.uniform(-1, 1, 6).astype(np.float32)
            (y,) = sess.run(None, {"X": x, "scale": w, "bias": b})
            np.testing.assert_allclose(y, group_norm_ref(x, 3, w, b), rtol=1e-5, atol=1e-5)


# ---- the package without torch ------------------------------------------------------------------

def test_package_works_without_torch(tmp_path):
    # A torch-free deployment: `import opbridge`, the ORT library, opbridge.onnx's schemas and
    # `opbridge check`. torch is made unimportable in a child process.
    model = _group_norm_model(["N", 4, 3])
    path = tmp_path / "gn.onnx"
    onnx.save(model, str(path))
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # any `import torch` now raises ImportError
        import opbridge, opbridge.onnx, onnx
        assert onnx.defs.has("GroupNorm", 1, "ai.opbridge")
        from opbridge.cli import main
        sys.exit(main(["check", {str(path)!r}]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ai.opbridge::GroupNorm" in proc.stdout and "OK" in proc.stdout
