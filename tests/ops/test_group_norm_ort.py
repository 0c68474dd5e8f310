"""ORT op ai.opbridge::GroupNorm on hand-built models: needs onnxruntime, onnx and numpy only."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import opbridge
from onnx import helper as onnx_helper
from helpers.onnx_models import single_node_model
from helpers.reference import group_norm as ref_group_norm

TOL = {np.float32: 2e-5, np.float64: 1e-12}


def _run(model, feeds, threads=None):
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    sess = opbridge.InferenceSession(model.SerializeToString(), sess_options=so)
    return sess.run(None, feeds)[0]


def _model(dtype, shape, num_groups=None, epsilon=None, scale=True, bias=True, domain_version=1):
    attrs = {}
    if num_groups is not None:
        attrs["num_groups"] = num_groups
    if epsilon is not None:
        attrs["epsilon"] = epsilon
    c = shape[1] if len(shape) > 1 else 1
    inputs = [("X", dtype, ["N"] + list(shape[1:])),
              ("scale", dtype, [c]) if scale else None,
              ("bias", dtype, [c]) if bias else None]
    while inputs and inputs[-1] is None:
        inputs.pop()
    return single_node_model("GroupNorm", "ai.opbridge", inputs, attrs, domain_version=domain_version)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,groups", [((3, 2, 1, 2), 2), ((2, 64, 16, 16), 32), ((4, 6), 3), ((2, 8, 7), 4),
                                          ((2, 4, 3, 2, 5), 2), ((1, 9, 33), 3)])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_float64_reference(rng, dtype, shape, groups, threads):
    x = (rng.standard_normal(shape) * 2 - 0.5).astype(dtype)
    w = rng.uniform(0.5, 2, shape[1]).astype(dtype)
    b = rng.standard_normal(shape[1]).astype(dtype)
    eps = float(np.float32(rng.uniform(1e-6, 1e-2)))
    y = _run(_model(dtype, shape, groups, eps), {"X": x, "scale": w, "bias": b}, threads)
    np.testing.assert_allclose(y, ref_group_norm(x, groups, w, b, eps), rtol=TOL[dtype], atol=TOL[dtype])


def test_default_epsilon_and_omitted_scale_bias(rng):
    x = rng.standard_normal((2, 6, 5)).astype(np.float32)
    y = _run(_model(np.float32, x.shape, 3, scale=False, bias=False), {"X": x})
    np.testing.assert_allclose(y, ref_group_norm(x, 3, eps=1e-5), rtol=2e-5, atol=2e-5)


def test_omitted_epsilon_is_the_float32_default(rng):
    # An ONNX float attribute is 32-bit: writing epsilon=1e-5 gives float32(1e-5), and leaving it
    # out must give the same. Small groups of small variance (~1e-4) make the difference between
    # float32(1e-5) and the double 1e-5 visible in float64 results (~1e-9 relative).
    x = rng.standard_normal((4, 6, 3, 3)) * 0.0124
    omitted = _run(_model(np.float64, x.shape, 3, scale=False, bias=False), {"X": x})
    explicit = _run(_model(np.float64, x.shape, 3, epsilon=1e-5, scale=False, bias=False), {"X": x})
    np.testing.assert_array_equal(omitted, explicit)
    np.testing.assert_allclose(omitted, ref_group_norm(x, 3, eps=float(np.float32(1e-5))), rtol=1e-12, atol=1e-12)


# ORT 1.17-1.23 get no shape inference for GroupNorm (optional inputs; cpp/ort/register.cpp).
ORT_VERSION = tuple(int(p) for p in ort.__version__.split(".")[:2])


@pytest.mark.parametrize("dtype,onnx_type", [(np.float32, "tensor(float)"), (np.float64, "tensor(double)")])
def test_output_type_and_shape_are_inferred_by_ort(dtype, onnx_type):
    # The graph output is declared with no type and no shape at all: whatever the session
    # reports comes from inference (the library's InferOutputShape), not from the model.
    model = _model(dtype, ("N", 6, "S"), 3)
    del model.graph.output[:]
    model.graph.output.append(onnx.ValueInfoProto(name="Y"))
    out = opbridge.InferenceSession(model.SerializeToString()).get_outputs()[0]
    assert out.type == onnx_type
    if ORT_VERSION >= (1, 24):
        assert out.shape == ["N", 6, "S"]


# Per case: the error, and feeds that are valid for the same node (None: no input is, e.g.
# num_groups = 0; the same session must then give the same error again).
@pytest.mark.parametrize(
    "case,match",
    [
        ("not_divisible", r"num_groups must divide .*C = x.shape\[1\] = 6, got num_groups = 4"),
        ("zero_groups", r"num_groups must be > 0, got 0"),
        ("scale_length", r"weight must have C = 6 elements .*got 5"),
        ("bias_length", r"bias must have C = 6 elements .*got 4"),
        ("rank1", r"rank >= 2 .*got rank 1"),
        ("negative_eps", r"eps must be finite and >= 0"),
    ],
)
def test_bad_input_gives_error_status_and_session_stays_usable(rng, case, match):
    shape, groups, eps = (2, 6, 3), 3, 1e-5
    feeds = {"X": rng.standard_normal(shape).astype(np.float32),
             "scale": rng.uniform(0.5, 2, 6).astype(np.float32),
             "bias": rng.standard_normal(6).astype(np.float32)}
    good = dict(feeds)
    if case == "not_divisible":
        groups = 4
        good = {"X": rng.standard_normal((3, 8, 5)).astype(np.float32),
                "scale": rng.uniform(0.5, 2, 8).astype(np.float32), "bias": rng.standard_normal(8).astype(np.float32)}
    elif case == "zero_groups":
        groups, good = 0, None
    elif case == "scale_length":
        feeds["scale"] = feeds["scale"][:5]
    elif case == "bias_length":
        feeds["bias"] = feeds["bias"][:4]
    elif case == "rank1":
        feeds = {"X": feeds["X"].reshape(-1)}
        good = {"X": good["X"]}
    elif case == "negative_eps":
        eps, good = -1.0, None
    model = single_node_model(
        "GroupNorm", "ai.opbridge",
        [("X", np.float32, None), ("scale", np.float32, None), ("bias", np.float32, None)][: len(feeds)],
        {"num_groups": groups, "epsilon": eps},
    )
    # The library's own run-time verdict, so a plain ORT session: opbridge.InferenceSession refuses
    # the attribute-only cases (zero_groups, negative_eps) at load already.
    sess = ort.InferenceSession(model.SerializeToString(), opbridge.session_options(),
                                providers=["CPUExecutionProvider"])
    if good is None:
        with pytest.raises(ValueError, match="static shapes already fail"):
            opbridge.InferenceSession(model.SerializeToString())
    with pytest.raises(Exception, match=match) as info:
        sess.run(None, feeds)
    assert "ai.opbridge::GroupNorm" in str(info.value)
    # The same session afterwards: a valid run gives the right result; where no input is valid,
    # the same error again (not a crash, not a stale state).
    if good is None:
        with pytest.raises(Exception, match=match):
            sess.run(None, feeds)
        return
    y = sess.run(None, good)[0]
    ref = ref_group_norm(good["X"], groups, good.get("scale"), good.get("bias"), eps)
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5)


def test_missing_num_groups_fails_session_creation():
    model = single_node_model("GroupNorm", "ai.opbridge", [("X", np.float32, [2, 4, 3])], {})
    with pytest.raises(Exception, match="required int attribute 'num_groups' is missing"):
        opbridge.InferenceSession(model.SerializeToString())


def test_integer_input_is_rejected_at_session_creation():
    model = single_node_model("GroupNorm", "ai.opbridge", [("X", np.float32, [2, 4, 3])], {"num_groups": 2})
    model.graph.input[0].type.tensor_type.elem_type = 6  # int32
    with pytest.raises(Exception):
        opbridge.InferenceSession(model.SerializeToString())


def test_library_path_and_session_options():
    import os

    path = opbridge.get_library_path()
    assert os.path.isabs(path) and os.path.isfile(path)
    so = opbridge.session_options()
    assert isinstance(so, ort.SessionOptions)


# ---- activation attribute ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("activation", [None, "none", "silu"])
@pytest.mark.parametrize("threads", [1, 2])
def test_activation_attribute(rng, dtype, activation, threads):
    shape, groups = (2, 12, 7, 5), 4
    x = (rng.standard_normal(shape) * 2 - 0.5).astype(dtype)
    w = rng.uniform(0.5, 2, shape[1]).astype(dtype)
    b = rng.standard_normal(shape[1]).astype(dtype)
    # activation exists since ai.opbridge version 2 (a version-1 model using it is refused).
    model = _model(dtype, shape, groups, 1e-5, domain_version=2 if activation is not None else 1)
    if activation is not None:
        model.graph.node[0].attribute.append(onnx_helper.make_attribute("activation", activation))
    y = _run(model, {"X": x, "scale": w, "bias": b}, threads)
    ref = ref_group_norm(x, groups, w, b, 1e-5, activation or "none")
    np.testing.assert_allclose(y, ref, rtol=TOL[dtype], atol=TOL[dtype] * 4)


@pytest.mark.parametrize("value,match", [
    ("relu", r"activation must be 'none' or 'silu', got 'relu'"),
    ("SiLU", r"activation must be 'none' or 'silu', got 'SiLU'"),
    (1, r"attribute 'activation' must be a string, got an int"),
])
def test_bad_activation_fails_session_creation_naming_node_op_and_attribute(value, match):
    model = _model(np.float32, (2, 6, 3), 3, domain_version=2)
    model.graph.node[0].name = "gn_act"
    model.graph.node[0].attribute.append(onnx_helper.make_attribute("activation", value))
    with pytest.raises(Exception, match=r"ai\.opbridge::GroupNorm \(node 'gn_act'\): " + match):
        opbridge.InferenceSession(model.SerializeToString())
