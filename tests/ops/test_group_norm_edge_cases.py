"""GroupNorm edge cases and numerical robustness, in ORT and torch: each a regression test for a
behaviour the fuzzer (tests/fuzz) pins down. Cases that could hang or crash a broken build run in
the fuzz worker process, so that they fail instead of stopping the test run."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import opbridge
from fuzz import harness, oracle
from helpers.onnx_models import single_node_model
from helpers.reference import group_norm as ref_group_norm

HAS_TORCH = True
try:
    import torch
except ImportError:  # ORT-only environment
    HAS_TORCH = False

TOL = {np.float32: 2e-5, np.float64: 1e-12, np.float16: 1e-3}


def _ort_model(dtype, groups, eps=None, affine=True, name=""):
    attrs = {"num_groups": groups}
    if eps is not None:
        attrs["epsilon"] = eps
    inputs = [("X", dtype, None)] + ([("scale", dtype, None), ("bias", dtype, None)] if affine else [])
    model = single_node_model("GroupNorm", "ai.opbridge", inputs, attrs)
    model.graph.node[0].name = name
    return model.SerializeToString()


def run_ort(x, groups, w=None, b=None, eps=None):
    feeds = {"X": x} if w is None else {"X": x, "scale": w, "bias": b}
    sess = opbridge.InferenceSession(_ort_model(x.dtype.type, groups, eps, affine=w is not None))
    return sess.run(None, feeds)[0]


def run_torch(x, groups, w=None, b=None, eps=None):
    t = lambda a: None if a is None else torch.from_numpy(a)  # noqa: E731
    return opbridge.ops.group_norm(t(x), groups, t(w), t(b), 1e-5 if eps is None else eps).numpy()


BACKENDS = [pytest.param(run_ort, id="ort"),
            pytest.param(run_torch, id="torch", marks=[pytest.mark.torch, pytest.mark.skipif(not HAS_TORCH,
                                                                                            reason="no torch")])]


def _check(out, ref, dtype):
    assert oracle.compare(out, oracle.Expected(ref, np.dtype(dtype).name, TOL[dtype] * (1 + np.abs(ref)))) is None, \
        oracle.compare(out, oracle.Expected(ref, np.dtype(dtype).name, TOL[dtype] * (1 + np.abs(ref))))


# ---- numerical robustness ----------------------------------------------------------------------
@pytest.mark.parametrize("run", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_constant_groups_give_the_bias(rng, run, dtype):
    # Zero variance: (x - mean) is exactly 0, so y = bias exactly (eps > 0).
    x = np.repeat(rng.standard_normal((3, 3, 1)) * 100, 2 * 20, axis=2).reshape(3, 6, 20).astype(dtype)
    w = rng.uniform(0.5, 2, 6).astype(dtype)
    b = rng.standard_normal(6).astype(dtype)
    y = run(x, 3, w, b, 1e-5)
    np.testing.assert_array_equal(y, np.broadcast_to(b[None, :, None], x.shape))


@pytest.mark.parametrize("run", BACKENDS)
def test_constant_groups_with_zero_eps_give_nan_like_torch(rng, run):
    # 0 / sqrt(0 + 0) is NaN, as in torch.nn.functional.group_norm; other groups are unaffected.
    x = rng.standard_normal((2, 4, 5)).astype(np.float32)
    x[0, :2] = 3.5  # group 0 of sample 0 is constant
    y = run(x, 2, eps=0.0)
    assert np.isnan(y[0, :2]).all() and np.isfinite(y[0, 2:]).all() and np.isfinite(y[1]).all()
    _check(y, ref_group_norm(x, 2, eps=0.0), np.float32)
    if HAS_TORCH:
        t = torch.nn.functional.group_norm(torch.from_numpy(x), 2, eps=0.0).numpy()
        np.testing.assert_array_equal(np.isnan(t), np.isnan(y))


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="no torch")
def test_tiny_eps_is_float32_as_in_onnx_runtime():
    # Float attributes are float32 (docs/declarations.md): eps=1e-300 is 0 in torch as in a model,
    # so a constant group gives what eps=0 gives in both, 0/0 (NaN, as torch's F.group_norm).
    x = np.full((1, 2, 4), 7.25, np.float32)
    w, b = np.ones(2, np.float32), np.array([1.5, -2.0], np.float32)
    y = run_torch(x, 1, w, b, 1e-300)
    assert np.isnan(y).all()
    np.testing.assert_array_equal(y, run_ort(x, 1, w, b, 1e-300))
    np.testing.assert_array_equal(y, torch.nn.functional.group_norm(torch.from_numpy(x), 1, eps=0.0).numpy())


@pytest.mark.parametrize("run", BACKENDS)
@pytest.mark.parametrize("offset", [1e4, 1e6, 1e7])
def test_large_offset_float32(rng, run, offset):
    # Mean 1e6, unit variance: one-pass E[x^2] - E[x]^2 loses every digit in float32, and so
    # does folding the mean into the bias (x * a + (b - m * a) rounds at 1e6). Ours stays within
    # the float32 tolerance of the float64 reference computed from the same float32 inputs.
    x = (rng.standard_normal((2, 8, 16, 16)) + offset).astype(np.float32)
    w = rng.uniform(0.5, 2, 8).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    y = run(x, 4, w, b)
    ref = ref_group_norm(x, 4, w, b)
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-5 * (1 + np.abs(ref)).max())


@pytest.mark.parametrize("run", BACKENDS)
def test_float16_near_range_limits(rng, run):
    # Data spanning +-65504 (statistics accumulate in float, no overflow) and tiny subnormal
    # groups; results within float16 rounding of the reference.
    x = (rng.uniform(-1, 1, (2, 4, 64)) * 65504).astype(np.float16)
    x[1, 2:] = (rng.standard_normal((2, 64)) * 1e-6).astype(np.float16)  # subnormal group
    y = run(x, 2)
    assert y.dtype == np.float16
    _check(y, ref_group_norm(x, 2), np.float16)
    # Outputs beyond the float16 range saturate to inf like the reference cast does.
    w = np.full(4, 60000, np.float16)
    y = run(x, 2, w, np.zeros(4, np.float16))
    ref = ref_group_norm(x, 2, w, np.zeros(4, np.float16))
    assert np.isinf(y[np.abs(ref) > 65520]).all()
    _check(y, ref, np.float16)


@pytest.mark.parametrize("run", BACKENDS)
def test_non_finite_inputs_propagate_like_the_reference(rng, run):
    x = rng.standard_normal((2, 6, 5)).astype(np.float32)
    x[0, 1, 2] = np.nan  # poisons group 0 of sample 0 only
    x[1, 5, 0] = np.inf  # a group with inf: NaN (inf - inf) everywhere in it
    w = rng.uniform(0.5, 2, 6).astype(np.float32)
    w[3] = np.inf  # +-inf where the normalized value is nonzero
    b = rng.standard_normal(6).astype(np.float32)
    b[4] = -np.inf
    y = run(x, 3, w, b)
    ref = ref_group_norm(x, 3, w, b)
    assert np.isnan(y[0, :2]).all() and np.isnan(y[1, 4:]).all() and np.isinf(y[0, 3]).all()
    _check(y, ref, np.float32)


# ---- empty tensors with enormous dims: nothing allocated, nothing looped over -------------------
@pytest.fixture(scope="module")
def ort_worker():
    with harness.Worker(modules=("ort",), timeout_s=60) as w:
        yield w


@pytest.mark.parametrize("shape", [[2**62, 1, 0], [2**31, 2**31, 0], [0, 2**62, 2**62], [3, 0, 2**61]])
def test_ort_empty_x_with_huge_dims(ort_worker, shape):
    # x = ConstantOfShape(shape); the result's shape is read back through Shape (numpy cannot
    # hold such an array). N * C may overflow int64 here: the op must neither loop N * G times
    # nor compute numel / (N * C).
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["X"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
             helper.make_node("GroupNorm", ["X"], ["Y"], domain="ai.opbridge", num_groups=1),
             helper.make_node("Shape", ["Y"], ["S"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("S", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.opbridge", 1)],
                              ir_version=9)
    status, reply = ort_worker.run({"kind": "ort", "model": model.SerializeToString(),
                                    "feeds": {"shape": np.array(shape, np.int64)}, "threads": 2})
    assert status == "ok" and reply[0] == "ok", (status, reply)
    assert reply[1][0].tolist() == shape


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="no torch")
@pytest.mark.parametrize("shape", [(2**62, 1, 0), (2**31, 2**31, 0)])
def test_torch_empty_x_with_huge_dims(shape):
    with harness.Worker(modules=("torch",), timeout_s=60) as w:
        x = {"data": np.zeros(0), "empty_shape": shape, "dtype": "float32", "layout": "empty"}
        status, reply = w.run({"kind": "torch", "op": "group_norm", "args": [x, 1, None, None, 1e-5]})
        assert status == "ok" and reply[0] == "ok", (status, reply)
        assert reply[1][0] == ("empty", shape, "float32")
        # Gradients of an empty input: dx empty, dweight/dbias zeros.
        xe = torch.empty(0, 4, 3, requires_grad=True)
        wt = torch.ones(4, requires_grad=True)
        bt = torch.ones(4, requires_grad=True)
        opbridge.ops.group_norm(xe, 2, wt, bt).sum().backward()
        assert xe.grad.shape == xe.shape and wt.grad.tolist() == [0.0] * 4 and bt.grad.tolist() == [0.0] * 4


# ---- ORT model-level behaviour -----------------------------------------------------------------
@pytest.mark.parametrize("declared", [None, ["N", "C", None], [2, 4, None]])
def test_shape_of_output_with_unknown_dims(declared):
    # ORT writes unknown dims handed back by a custom op's shape inference as literal -1; its
    # optimizer then folded Shape(Y) into [-1, ...]. The op must give unknown dims symbols.
    nodes = [helper.make_node("GroupNorm", ["X"], ["Y"], domain="ai.opbridge", num_groups=2),
             helper.make_node("Shape", ["Y"], ["S"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, declared)],
                              [helper.make_tensor_value_info("S", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.opbridge", 1)],
                              ir_version=9)
    sess = opbridge.InferenceSession(model.SerializeToString())  # default: all optimizations on
    assert sess.run(None, {"X": np.ones((2, 4, 3), np.float32)})[0].tolist() == [2, 4, 3]


@pytest.mark.parametrize("attrs,match", [
    ({"num_groups": 2, "epsilon": 0}, r"attribute 'epsilon' must be a float, got an int"),
    ({"num_groups": 2.0}, r"attribute 'num_groups' must be an int, got a float"),
    ({"num_groups": "2"}, r"attribute 'num_groups' must be an int, got a string"),
    ({"num_groups": [2]}, r"attribute 'num_groups' must be an int, got a list of ints"),
    ({}, r"required int attribute 'num_groups' is missing"),
])
def test_attribute_of_wrong_type_is_an_error_not_a_default(attrs, match):
    # epsilon=0 written as an int used to run silently with the default 1e-5.
    model = single_node_model("GroupNorm", "ai.opbridge", [("X", np.float32, None)], attrs).SerializeToString()
    with pytest.raises(Exception, match=r"ai\.opbridge::GroupNorm: " + match):
        opbridge.InferenceSession(model)


def test_error_names_the_node(rng):
    sess = opbridge.InferenceSession(_ort_model(np.float32, 4, name="gn_block3"))
    x = rng.standard_normal((2, 6, 3)).astype(np.float32)
    ort.set_default_logger_severity(4)
    try:
        with pytest.raises(Exception, match=r"ai\.opbridge::GroupNorm \(node 'gn_block3'\): num_groups must divide"):
            sess.run(None, {"X": x, "scale": np.ones(6, np.float32), "bias": np.ones(6, np.float32)})
    finally:
        ort.set_default_logger_severity(2)


# ---- torch-specific ----------------------------------------------------------------------------
@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="no torch")
def test_mixed_devices_raise_instead_of_returning_garbage(rng):
    # A meta weight with a CPU x dispatches to the Meta (fake) kernel, which used to return an
    # uninitialized CPU tensor.
    x = torch.from_numpy(rng.standard_normal((2, 4, 3))).float()
    with pytest.raises(ValueError, match="weight must be on x's device"):
        opbridge.ops.group_norm(x, 2, torch.ones(4, device="meta"))
    with pytest.raises(ValueError, match="bias must be on x's device"):
        opbridge.ops.group_norm(x.to("meta"), 2, None, torch.ones(4))
    y = opbridge.ops.group_norm(x.to("meta"), 2, torch.ones(4, device="meta"))
    assert y.device.type == "meta" and y.shape == x.shape


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="no torch")
def test_single_element_groups(rng):
    # torch.nn.functional.group_norm refuses these ("Expected more than 1 value per channel when
    # training", a batch-norm heuristic); the normalized value of a one-element group is 0, so
    # opbridge returns the bias, as ONNX GroupNormalization does.
    x = rng.standard_normal((1, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    y = run_torch(x, 3, np.ones(3, np.float32), b)
    np.testing.assert_array_equal(y, b[None])
    np.testing.assert_array_equal(run_ort(x, 3, np.ones(3, np.float32), b), b[None])
