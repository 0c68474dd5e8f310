"""``opbridge optimize``: every GroupNorm form it rewrites, its check, its refusals, and ONNX's own
GroupNormalization test cases after rewriting. Hand-built models (no torch) except where noted.

Each rewritten model is compared with a float64 reference written here (tests/helpers/reference.py), on
fresh random inputs; models with a fused SiLU are also run through onnx's reference evaluator
with ai.opbridge::GroupNorm evaluated by that reference (so that the graph is checked even where
opbridge's ORT library lacks the activation attribute: see optimize_support.needs_ort_silu)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import opbridge
from helpers.onnx_models import IR_VERSION
from opbridge import _optimize
from opbridge.onnx import _group_norm_fusion, _rewrite
from opbridge.cli import main
from helpers.optimize_support import group_norm_act_ref, needs_ort_silu, reference_run, silu
from helpers.reference import group_norm as ref_group_norm

NP_TYPES = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.float64: TensorProto.DOUBLE}
# onnxruntime 1.17 (scripts/ort_matrix.sh) loads IR <= 9 / opset <= 20: no GroupNormalization-21.
needs_opset_21 = pytest.mark.skipif(tuple(int(p) for p in ort.__version__.split(".")[:2]) < (1, 18),
                                    reason=f"onnxruntime {ort.__version__} loads opset <= 20 (GroupNormalization-21 "
                                           "needs onnxruntime >= 1.18)")


def _model(nodes, inputs, outputs, inits=(), opset=17, domains=()):
    graph = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in domains]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, NP_TYPES[dtype], shape)


def _save(model, tmp_path, name="in.onnx"):
    path = str(tmp_path / name)
    onnx.save(model, path)
    return path


def _optimize_cli(capsys, src, dst, *args):
    code = main(["optimize", src, dst, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _ops(path_or_model):
    m = onnx.load(path_or_model) if isinstance(path_or_model, str) else path_or_model
    return [(n.domain, n.op_type) for n in m.graph.node]


def _gn_nodes(model):
    return [n for n in model.graph.node if n.domain == opbridge.DOMAIN and n.op_type == "GroupNorm"]


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _run_ort(path, feeds, library=True):
    if library:
        sess = opbridge.InferenceSession(path)
    else:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# ---------------------------------------------------------------------------------------------
# torch's GroupNorm decomposition, built by hand in both exporters' spellings
# ---------------------------------------------------------------------------------------------


def decomposition_model(rng, *, style="torchscript", c=8, g=4, spatial=(5, 6), mul=True, add=True,
                        in_affine=False, dtype=np.float32, eps=1e-5, batch="N", then_silu=False, restore=True,
                        cast_like=None):
    """X -> Reshape [0, G, -1] -> InstanceNormalization -> Reshape(shape of X) -> Mul -> Add.

    style: "torchscript" (Constant nodes, Shape(X)), "dynamo" (initializers, Shape(X, start=0)) or
    "static" (the restoring shape is a constant; batch must be static). in_affine: the
    InstanceNormalization gets a per-group scale/shift other than 1/0 (no exporter does that, but
    the rewrite folds it). restore=False: no second Reshape (the dynamo exporter drops it where
    it does nothing: rank 3, G = C). cast_like: the weight and bias are stored in this type and
    pass through CastLike(·, y) before the Mul / Add, as the dynamo exporter writes them for
    bfloat16 (there with the type they already have). Returns (model, params) with the float64
    values for the reference."""
    rank = 2 + len(spatial)
    shape = [batch, c, *spatial]
    s = rng.uniform(0.5, 1.5, g) if in_affine else np.ones(g)
    t = rng.uniform(-0.5, 0.5, g) if in_affine else np.zeros(g)
    w = rng.uniform(0.5, 1.5, c)
    b = rng.uniform(-0.5, 0.5, c)
    bshape = [c] + [1] * (rank - 2)
    inits, nodes = [], []

    def const(name, arr):
        if style == "torchscript":
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name)))
        else:
            inits.append(numpy_helper.from_array(arr, name))

    const("grouped_shape", np.array([0, g, -1], np.int64))
    const("in_scale", s.astype(dtype))
    const("in_bias", t.astype(dtype))
    nodes.append(helper.make_node("Reshape", ["x", "grouped_shape"], ["grouped"]))
    nodes.append(helper.make_node("InstanceNormalization", ["grouped", "in_scale", "in_bias"], ["normed"], epsilon=eps))
    y = "normed"
    if restore:
        if style == "static":
            const("x_shape", np.array(shape, np.int64))
        elif style == "dynamo":
            nodes.append(helper.make_node("Shape", ["x"], ["x_shape"], start=0))
        else:
            nodes.append(helper.make_node("Shape", ["x"], ["x_shape"]))
        nodes.append(helper.make_node("Reshape", ["normed", "x_shape"], ["restored"]))
        y = "restored"
    def affine(name, arr, y):
        if cast_like is None:
            inits.append(numpy_helper.from_array(arr.astype(dtype).reshape(bshape), name))
            return name
        inits.append(numpy_helper.from_array(arr.astype(cast_like).reshape(bshape), name + "_stored"))
        nodes.append(helper.make_node("CastLike", [name + "_stored", y], [name]))
        return name

    if mul:
        nodes.append(helper.make_node("Mul", [y, affine("weight", w, y)], ["scaled"]))
        y = "scaled"
    if add:
        nodes.append(helper.make_node("Add", [y, affine("bias", b, y)], ["shifted"]))
        y = "shifted"
    if then_silu:
        nodes.append(helper.make_node("Sigmoid", [y], ["sig"]))
        nodes.append(helper.make_node("Mul", [y, "sig"], ["act"]))
        y = "act"
    nodes.append(helper.make_node("Identity", [y], ["y"]))
    out_shape = shape if restore else [batch, g, None]
    model = _model(nodes, [_vi("x", dtype, shape)], [_vi("y", dtype, out_shape)], inits)
    return model, dict(g=g, s=s, t=t, w=w if mul else None, b=b if add else None, eps=eps, silu=then_silu)


def decomposition_ref(x, p):
    """float64: w * (s_g * xhat + t_g) + b, then SiLU when asked."""
    c = x.shape[1]
    rep = c // p["g"]
    bshape = (1, c) + (1,) * (x.ndim - 2)
    y = ref_group_norm(x, p["g"], eps=float(np.float32(p["eps"])))
    y = y * np.repeat(p["s"], rep).reshape(bshape) + np.repeat(p["t"], rep).reshape(bshape)
    if p["w"] is not None:
        y = y * p["w"].reshape(bshape)
    if p["b"] is not None:
        y = y + p["b"].reshape(bshape)
    return silu(y) if p["silu"] else y


@pytest.mark.parametrize("style", ["torchscript", "dynamo", "static"])
@pytest.mark.parametrize("mul, add", [(True, True), (True, False), (False, True), (False, False)])
def test_decomposition_becomes_one_group_norm(tmp_path, capsys, rng, style, mul, add):
    batch = 3 if style == "static" else "N"
    model, p = decomposition_model(rng, style=style, mul=mul, add=add, batch=batch)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst, *([] if style == "static" else ["--dim", "N=3"]))
    assert code == 0, out
    assert _group_norm_fusion.LABEL_DECOMPOSITION in out and "x1" in out
    ops = _ops(dst)
    assert ops == [(opbridge.DOMAIN, "GroupNorm"), ("", "Identity")], ops
    assert "input  x: float32 [3, 8, 5, 6]" in out  # --dim reached the check
    node = _gn_nodes(onnx.load(dst))[0]
    assert _attr(node, "num_groups") == 4 and _attr(node, "activation") is None
    x = rng.standard_normal((3, 8, 5, 6)).astype(np.float32) * 2 + 0.5
    got = _run_ort(dst, {"x": x})[0]
    np.testing.assert_allclose(got, decomposition_ref(x, p), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spatial", [(), (7,), (3, 4, 5)])
def test_decomposition_of_other_ranks_and_folded_instance_norm_affine(tmp_path, capsys, rng, spatial):
    model, p = decomposition_model(rng, style="dynamo", c=6, g=3, spatial=spatial, in_affine=True, eps=1e-3)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out
    assert (opbridge.DOMAIN, "GroupNorm") in _ops(dst) and ("", "InstanceNormalization") not in _ops(dst)
    x = rng.standard_normal((2, 6, *spatial)).astype(np.float32)
    np.testing.assert_allclose(_run_ort(dst, {"x": x})[0], decomposition_ref(x, p), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mul, add", [(True, True), (False, False)])
@pytest.mark.parametrize("style", ["torchscript", "dynamo"])
def test_decomposition_without_the_restoring_reshape_when_it_does_nothing(tmp_path, capsys, rng, style, mul, add):
    """GroupNorm(C, C) of a 3-D X: the dynamo exporter's optimizer drops the second Reshape, which
    gives X's shape anyway (wav2vec2's feature encoder); the rest is still one GroupNorm."""
    model, p = decomposition_model(rng, style=style, c=6, g=6, spatial=(7,), mul=mul, add=add, in_affine=True,
                                   restore=False)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst, "--dim", "N=3")
    assert code == 0, out
    assert _group_norm_fusion.LABEL_DECOMPOSITION_3D in out and "x1" in out
    assert _ops(dst) == [(opbridge.DOMAIN, "GroupNorm"), ("", "Identity")], _ops(dst)
    assert _attr(_gn_nodes(onnx.load(dst))[0], "num_groups") == 6
    x = rng.standard_normal((3, 6, 7)).astype(np.float32) * 2 + 0.5
    np.testing.assert_allclose(_run_ort(dst, {"x": x})[0], decomposition_ref(x, p), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c, g, spatial", [(6, 3, (7,)), (6, 6, (3, 4))])
def test_instance_norm_without_the_restoring_reshape_is_not_a_group_norm(tmp_path, capsys, rng, c, g, spatial):
    """Without the second Reshape the InstanceNormalization's output is (N, G, C/G * S): X's shape
    only for rank 3 and G = C. Otherwise nothing is rewritten (and nothing is said about it)."""
    model, _ = decomposition_model(rng, style="dynamo", c=c, g=g, spatial=spatial, mul=False, add=False,
                                   restore=False)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out
    assert "no GroupNorm pattern found" in out and "not rewritten" not in out
    assert ("", "InstanceNormalization") in _ops(dst) and not _gn_nodes(onnx.load(dst))


def test_cast_like_to_the_same_type_does_not_keep_the_affine_and_silu_apart(tmp_path, capsys, rng):
    """The dynamo exporter writes Mul(y, CastLike(w, y)) / Add(·, CastLike(b, ·)) for bfloat16: a
    CastLike that changes nothing, whose second input made y a value read twice, so that only the
    core was rewritten, and the Mul, Add and SiLU stayed. (float32 here, so that ORT checks it on
    any CPU: the rule looks at types, not at which.)"""
    model, p = decomposition_model(rng, style="dynamo", cast_like=np.float32, then_silu=True)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst, "--dim", "N=2")
    assert code == 0, out
    assert _group_norm_fusion.LABEL_CAST_LIKE in out and _group_norm_fusion.LABEL_SILU in out
    assert _ops(dst) == [(opbridge.DOMAIN, "GroupNorm"), ("", "Identity")], _ops(dst)
    assert _attr(_gn_nodes(onnx.load(dst))[0], "activation") == b"silu"
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    np.testing.assert_allclose(_run_ort(dst, {"x": x})[0], decomposition_ref(x, p), rtol=1e-4, atol=1e-4)


def test_cast_like_that_casts_stays(tmp_path, capsys, rng):
    """A float16 weight cast to float32 is a real cast: it stays, and so do the Mul and Add it
    feeds (the core is still rewritten)."""
    model, p = decomposition_model(rng, style="dynamo", cast_like=np.float16)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst, "--dim", "N=2")
    assert code == 0, out
    assert _group_norm_fusion.LABEL_CAST_LIKE not in out
    assert [op for _, op in _ops(dst)].count("CastLike") == 2 and (opbridge.DOMAIN, "GroupNorm") in _ops(dst)
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    p = dict(p, w=p["w"].astype(np.float16).astype(np.float64), b=p["b"].astype(np.float16).astype(np.float64))
    np.testing.assert_allclose(_run_ort(dst, {"x": x})[0], decomposition_ref(x, p), rtol=1e-4, atol=1e-4)


def test_float16_decomposition(tmp_path, capsys, rng):
    model, p = decomposition_model(rng, style="torchscript", dtype=np.float16)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out
    assert "float16" in out and (opbridge.DOMAIN, "GroupNorm") in _ops(dst)
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float16)
    got = _run_ort(dst, {"x": x})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), decomposition_ref(x.astype(np.float64), p), atol=2e-2, rtol=2e-2)


def test_mul_that_is_not_per_channel_stays_and_the_core_is_rewritten(tmp_path, capsys, rng):
    """A (W,)-shaped weight scales the last axis, not the channels: it must not become GroupNorm's
    scale. The Reshape/InstanceNormalization/Reshape core is still rewritten, the Mul kept."""
    model, p = decomposition_model(rng, style="dynamo", add=False)
    w_last = rng.uniform(0.5, 1.5, 6).astype(np.float32)  # W = 6
    for init in model.graph.initializer:
        if init.name == "weight":
            init.CopyFrom(numpy_helper.from_array(w_last, "weight"))
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out
    assert _ops(dst) == [(opbridge.DOMAIN, "GroupNorm"), ("", "Mul"), ("", "Identity")]
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    expect = ref_group_norm(x, 4) * w_last
    np.testing.assert_allclose(_run_ort(dst, {"x": x})[0], expect, rtol=1e-4, atol=1e-4)


def test_grouping_that_is_not_a_group_norm_is_left_with_a_note(tmp_path, capsys, rng):
    """Reshape(X, [0, 4, -1]) of 6 channels: groups straddle channels; not a GroupNorm."""
    model, _ = decomposition_model(rng, style="dynamo", c=6, g=4, spatial=(4, 4))
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out
    assert "no GroupNorm pattern found" in out
    assert "4 groups do not divide the 6 channels" in out
    assert ("", "InstanceNormalization") in _ops(dst)


# ---------------------------------------------------------------------------------------------
# GroupNormalization-18 and -21
# ---------------------------------------------------------------------------------------------


def _gn_standard_model(rng, opset, *, c=8, g=4, const_params=True, dtype=np.float32):
    n = g if opset < 21 else c
    scale, bias = rng.uniform(0.5, 1.5, n), rng.uniform(-0.5, 0.5, n)
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=g, epsilon=1e-4)
    inputs = [_vi("x", dtype, ["N", c, 5, 6])]
    inits = []
    if const_params:
        inits = [numpy_helper.from_array(scale.astype(dtype), "scale"), numpy_helper.from_array(bias.astype(dtype), "bias")]
    else:
        inputs += [_vi("scale", dtype, [n]), _vi("bias", dtype, [n])]
    model = _model([node], inputs, [_vi("y", dtype, ["N", c, 5, 6])], inits, opset=opset)
    return model, scale, bias


def test_group_normalization_18_per_group_scale_becomes_per_channel(tmp_path, capsys, rng):
    model, scale, bias = _gn_standard_model(rng, 18)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out  # the check ran GroupNormalization-18 itself (ORT expands its function)
    assert _group_norm_fusion.LABEL_GN18 in out
    assert _ops(dst) == [(opbridge.DOMAIN, "GroupNorm")]
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    # GroupNormalization-18: one scale/bias per GROUP, i.e. per 2 channels here.
    expect = ref_group_norm(x, 4, np.repeat(scale, 2), np.repeat(bias, 2), eps=float(np.float32(1e-4)))
    np.testing.assert_allclose(_run_ort(dst, {"x": x})[0], expect, rtol=1e-4, atol=1e-4)


def test_group_normalization_18_with_non_constant_scale_is_skipped_with_a_message(tmp_path, capsys, rng):
    model, _, _ = _gn_standard_model(rng, 18, const_params=False)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out
    assert "no GroupNorm pattern found" in out
    assert "GroupNormalization-18's scale/bias are not constants" in out
    assert _ops(dst) == [("", "GroupNormalization")]


@needs_opset_21
@pytest.mark.parametrize("const_params", [True, False])
def test_group_normalization_21(tmp_path, capsys, rng, const_params):
    model, scale, bias = _gn_standard_model(rng, 21, const_params=const_params)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out
    assert _group_norm_fusion.LABEL_GN21 in out and _ops(dst) == [(opbridge.DOMAIN, "GroupNorm")]
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    feeds = {"x": x} if const_params else {"x": x, "scale": scale.astype(np.float32), "bias": bias.astype(np.float32)}
    expect = ref_group_norm(x, 4, scale, bias, eps=float(np.float32(1e-4)))
    np.testing.assert_allclose(_run_ort(dst, feeds)[0], expect, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def onnx_group_norm_cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unrelated generators warn about overflowing casts
        cases = [c for c in collect_testcases("GroupNormalization") if "group_normalization" in c.name]
    assert len(cases) >= 2
    return cases


@needs_opset_21
def test_onnx_backend_group_normalization_cases_pass_after_rewriting(tmp_path, onnx_group_norm_cases):
    """ONNX's own GroupNormalization node tests (generated by the onnx wheel): each model is
    optimized, run in ORT with opbridge, and compared with the expected outputs at the case's
    tolerances. The *_expanded variants (the op's function body) contain no GroupNorm form and
    must come through unchanged."""
    rewritten = 0
    for case in onnx_group_norm_cases:
        src, dst = str(tmp_path / f"{case.name}.onnx"), str(tmp_path / f"{case.name}.opt.onnx")
        onnx.save(case.model, src)
        report = _optimize.optimize(src, dst, out=io.StringIO())
        assert report.ok, (case.name, report.error)
        optimized = onnx.load(dst)
        if "expanded" not in case.name:
            assert _ops(optimized) == [(opbridge.DOMAIN, "GroupNorm")], case.name
            rewritten += 1
        sess = opbridge.InferenceSession(dst)
        names = [i.name for i in sess.get_inputs()]
        for inputs, outputs in case.data_sets:
            got = sess.run(None, dict(zip(names, inputs)))
            for g, e in zip(got, outputs):
                np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol, err_msg=case.name)
    assert rewritten >= 2


# ---------------------------------------------------------------------------------------------
# com.microsoft::GroupNorm
# ---------------------------------------------------------------------------------------------


def ms_ref(x, gamma, beta, groups, eps, activation, channels_last):
    """The contrib op's documented semantics from tests/helpers/reference.py (NHWC moved to NCHW)."""
    xc = np.moveaxis(x.astype(np.float64), -1, 1) if channels_last else x.astype(np.float64)
    y = group_norm_act_ref(xc, groups, gamma, beta, eps, "silu" if activation else "none")
    return np.moveaxis(y, 1, -1) if channels_last else y


def ms_model(rng, *, channels_last=1, activation=0, wrapped=False, dtype=np.float32, gamma_dtype=np.float32, c=8,
             groups=4):
    gamma, beta = rng.uniform(0.5, 1.5, c), rng.uniform(-0.5, 0.5, c)
    inits = [numpy_helper.from_array(gamma.astype(gamma_dtype), "gamma"),
             numpy_helper.from_array(beta.astype(gamma_dtype), "beta")]
    attrs = dict(activation=activation, groups=groups, epsilon=1e-5)
    if not channels_last:
        attrs["channels_last"] = 0
    nchw, nhwc = ["N", c, 5, 6], ["N", 5, 6, c]
    if wrapped:  # NCHW model around an NHWC GroupNorm: the layout ORT's transformer tools produce
        nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 3, 1]),
                 helper.make_node("GroupNorm", ["xt", "gamma", "beta"], ["yt"], domain="com.microsoft", **attrs),
                 helper.make_node("Transpose", ["yt"], ["y0"], perm=[0, 3, 1, 2]),
                 helper.make_node("Relu", ["y0"], ["y"])]
        io_shape = nchw
    else:
        nodes = [helper.make_node("GroupNorm", ["x", "gamma", "beta"], ["y"], domain="com.microsoft", **attrs)]
        io_shape = nhwc if channels_last else nchw
    model = _model(nodes, [_vi("x", dtype, io_shape)], [_vi("y", dtype, io_shape)], inits,
                   domains=[("com.microsoft", 1)])
    return model, gamma, beta


@pytest.mark.parametrize("channels_last", [1, 0])
def test_microsoft_group_norm(tmp_path, capsys, rng, channels_last):
    model, gamma, beta = ms_model(rng, channels_last=channels_last)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out
    assert "float64 numpy" in out  # ORT has no CPU kernel for the original: checked against the reference
    expected_ops = [(opbridge.DOMAIN, "GroupNorm")]
    if channels_last:
        expected_ops = [("", "Transpose")] + expected_ops + [("", "Transpose")]
    assert _ops(dst) == expected_ops
    shape = (2, 5, 6, 8) if channels_last else (2, 8, 5, 6)
    x = rng.standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(_run_ort(dst, {"x": x})[0], ms_ref(x, gamma, beta, 4, 1e-5, 0, channels_last),
                               rtol=1e-4, atol=1e-4)


def test_microsoft_group_norm_between_transposes_runs_without_any(tmp_path, capsys, rng):
    model, gamma, beta = ms_model(rng, wrapped=True)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out
    assert _group_norm_fusion.LABEL_TRANSPOSES in out
    assert _ops(dst) == [(opbridge.DOMAIN, "GroupNorm"), ("", "Relu")]
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    expect = np.maximum(ms_ref(x, gamma, beta, 4, 1e-5, 0, 0), 0)
    np.testing.assert_allclose(_run_ort(dst, {"x": x})[0], expect, rtol=1e-4, atol=1e-4)


def test_microsoft_group_norm_float16_with_float32_gamma(tmp_path, capsys, rng):
    model, gamma, beta = ms_model(rng, dtype=np.float16, gamma_dtype=np.float32)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out
    x = rng.standard_normal((2, 5, 6, 8)).astype(np.float16)
    got = _run_ort(dst, {"x": x})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), ms_ref(x, gamma, beta, 4, 1e-5, 0, 1), rtol=2e-2, atol=2e-2)


def test_microsoft_group_norm_with_silu_graph(tmp_path, rng):
    """activation=1 becomes activation="silu"; the graph is checked with the float64 reference
    (independent of the ORT library, see the next test for ORT)."""
    model, gamma, beta = ms_model(rng, activation=1)
    m = _optimize.load(_save(model, tmp_path))
    result = _rewrite.rewrite_model(m)
    assert result.counts[_group_norm_fusion.LABEL_MS] == 1
    import onnx_ir as ir

    proto = ir.serde.serialize_model(m)
    node = _gn_nodes(proto)[0]
    assert _attr(node, "activation") == b"silu"
    assert {o.domain: o.version for o in proto.opset_import}[opbridge.DOMAIN] == 2
    x = rng.standard_normal((2, 5, 6, 8)).astype(np.float32)
    np.testing.assert_allclose(reference_run(proto, {"x": x})[0], ms_ref(x, gamma, beta, 4, 1e-5, 1, 1),
                               rtol=1e-5, atol=1e-5)


@needs_ort_silu
def test_microsoft_group_norm_with_silu_in_ort(tmp_path, capsys, rng):
    model, gamma, beta = ms_model(rng, activation=1)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out
    x = rng.standard_normal((2, 5, 6, 8)).astype(np.float32)
    np.testing.assert_allclose(_run_ort(dst, {"x": x})[0], ms_ref(x, gamma, beta, 4, 1e-5, 1, 1), rtol=1e-4, atol=1e-4)


def test_microsoft_group_norm_with_unknown_activation_is_left_with_a_note(tmp_path, capsys, rng):
    model, _, _ = ms_model(rng, activation=2)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out
    assert "activation = 2" in out and _ops(dst) == [("com.microsoft", "GroupNorm")]


# ---------------------------------------------------------------------------------------------
# SiLU fusion
# ---------------------------------------------------------------------------------------------


def silu_model(rng, form, *, c=8, g=4, extra_reader=False):
    """ai.opbridge::GroupNorm followed by a SiLU form (opset 24 for Swish)."""
    w, b = rng.uniform(0.5, 1.5, c), rng.uniform(-0.5, 0.5, c)
    inits = [numpy_helper.from_array(w.astype(np.float32), "w"), numpy_helper.from_array(b.astype(np.float32), "b")]
    nodes = [helper.make_node("GroupNorm", ["x", "w", "b"], ["gn"], domain=opbridge.DOMAIN, num_groups=g)]
    opset, domains = 17, [(opbridge.DOMAIN, 1)]
    if form == "sigmoid_mul":
        nodes += [helper.make_node("Sigmoid", ["gn"], ["s"]), helper.make_node("Mul", ["gn", "s"], ["y"])]
    elif form == "mul_sigmoid":
        nodes += [helper.make_node("Sigmoid", ["gn"], ["s"]), helper.make_node("Mul", ["s", "gn"], ["y"])]
    elif form == "swish":
        nodes += [helper.make_node("Swish", ["gn"], ["y"])]
        opset = 24
    elif form == "quick_gelu":
        nodes += [helper.make_node("QuickGelu", ["gn"], ["y"], domain="com.microsoft", alpha=1.0)]
        domains.append(("com.microsoft", 1))
    elif form == "div":
        inits.append(numpy_helper.from_array(np.array(1.0, np.float32), "one"))
        nodes += [helper.make_node("Neg", ["gn"], ["ng"]), helper.make_node("Exp", ["ng"], ["e"]),
                  helper.make_node("Add", ["one", "e"], ["den"]), helper.make_node("Div", ["gn", "den"], ["y"])]
    outputs = [_vi("y", np.float32, ["N", c, 5, 6])]
    if extra_reader:
        outputs.append(_vi("gn", np.float32, ["N", c, 5, 6]))  # the GroupNorm output is read outside
    model = _model(nodes, [_vi("x", np.float32, ["N", c, 5, 6])], outputs, inits, opset=opset, domains=domains)
    return model, w, b


SILU_FORMS = ["sigmoid_mul", "mul_sigmoid", "swish", "quick_gelu", "div"]


@pytest.mark.parametrize("form", SILU_FORMS)
def test_silu_forms_fuse_into_one_node(tmp_path, rng, form):
    model, w, b = silu_model(rng, form)
    m = _optimize.load(_save(model, tmp_path))
    result = _rewrite.rewrite_model(m)
    assert result.counts[_group_norm_fusion.LABEL_SILU] == 1
    import onnx_ir as ir

    proto = ir.serde.serialize_model(m)
    assert _ops(proto) == [(opbridge.DOMAIN, "GroupNorm")]
    assert _attr(proto.graph.node[0], "activation") == b"silu"
    assert {o.domain: o.version for o in proto.opset_import}[opbridge.DOMAIN] == 2
    assert proto.graph.output[0].name == "y"
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    expect = group_norm_act_ref(x, 4, w, b, activation="silu")
    np.testing.assert_allclose(reference_run(proto, {"x": x})[0], expect, rtol=1e-5, atol=1e-5)


@needs_ort_silu
@pytest.mark.parametrize("form", ["sigmoid_mul", "quick_gelu", "div"])
def test_silu_fusion_checked_and_run_in_ort(tmp_path, capsys, rng, form):
    model, w, b = silu_model(rng, form)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    np.testing.assert_allclose(_run_ort(dst, {"x": x})[0], group_norm_act_ref(x, 4, w, b, activation="silu"),
                               rtol=1e-4, atol=1e-4)


@needs_ort_silu
def test_decomposition_with_silu_from_torch_exporters_in_ort(tmp_path, capsys, rng):
    model, p = decomposition_model(rng, style="torchscript", then_silu=True)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0, out
    assert _ops(dst) == [(opbridge.DOMAIN, "GroupNorm"), ("", "Identity")]
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    np.testing.assert_allclose(_run_ort(dst, {"x": x})[0], decomposition_ref(x, p), rtol=1e-4, atol=1e-4)


def test_decomposition_with_silu_graph(tmp_path, rng):
    model, p = decomposition_model(rng, style="torchscript", then_silu=True)
    m = _optimize.load(_save(model, tmp_path))
    result = _rewrite.rewrite_model(m)
    assert result.counts[_group_norm_fusion.LABEL_DECOMPOSITION] == 1 and result.counts[_group_norm_fusion.LABEL_SILU] == 1
    import onnx_ir as ir

    proto = ir.serde.serialize_model(m)
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    np.testing.assert_allclose(reference_run(proto, {"x": x})[0], decomposition_ref(x, p), rtol=1e-5, atol=1e-5)


def test_silu_not_fused_when_the_group_norm_output_is_read_elsewhere(tmp_path, capsys, rng):
    model, w, b = silu_model(rng, "sigmoid_mul", extra_reader=True)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 0 and "no GroupNorm pattern found" in out
    assert [op for _, op in _ops(dst)] == ["GroupNorm", "Sigmoid", "Mul"]
    assert all(_attr(n, "activation") is None for n in _gn_nodes(onnx.load(dst)))


def test_no_silu_option_keeps_the_activation_separate(tmp_path, capsys, rng):
    model, p = decomposition_model(rng, style="dynamo", then_silu=True)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst, "--no-silu")
    assert code == 0, out
    assert [op for _, op in _ops(dst)] == ["GroupNorm", "Sigmoid", "Mul", "Identity"]
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    np.testing.assert_allclose(_run_ort(dst, {"x": x})[0], decomposition_ref(x, p), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# The check, refusals, files, arguments
# ---------------------------------------------------------------------------------------------


def test_a_rewrite_that_disagrees_is_refused_and_nothing_is_written(tmp_path, capsys, rng, monkeypatch):
    """Breaks the rewrite on purpose (wrong epsilon on every new node): the check must catch it."""
    real = _optimize.rewrite_model

    def broken(model, **kwargs):
        result = real(model, **kwargs)
        import onnx_ir as ir

        for node in model.graph:
            if node.domain == opbridge.DOMAIN:
                node.attributes["epsilon"] = ir.AttrFloat32("epsilon", 10.0)
        return result

    monkeypatch.setattr(_optimize, "rewrite_model", broken)
    model, _ = decomposition_model(rng)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 1
    assert "FAILED: output 'y' disagrees" in out and "DISAGREES" in out and "was not written" in out
    assert not os.path.exists(dst)
    assert sorted(os.listdir(tmp_path)) == ["in.onnx"]  # no scratch folder left behind


def test_a_model_the_check_cannot_run_is_refused(tmp_path, capsys, rng):
    model, _ = decomposition_model(rng)
    model.graph.node.append(helper.make_node("Frobnicate", ["y"], ["z"], domain="com.acme"))
    model.graph.output[0].CopyFrom(_vi("z", np.float32, None))
    model.opset_import.append(helper.make_opsetid("com.acme", 1))
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 1 and "com.acme::Frobnicate" in out and not os.path.exists(dst)


def test_a_model_ort_cannot_load_on_this_provider_is_refused_as_such(tmp_path, capsys, rng):
    """A bfloat16 Conv has no CPU kernel in ORT: the original model cannot be loaded, and the
    message says so (not that the rewritten one cannot), with the way out."""
    model, _ = decomposition_model(rng, style="dynamo", dtype=np.float32)
    model = onnx.helper.make_model(model.graph, opset_imports=model.opset_import, ir_version=IR_VERSION)
    wconv = rng.standard_normal((8, 8, 1, 1)).astype(np.float32)
    bf16 = onnx.numpy_helper.from_array(wconv, "wconv")
    bf16 = helper.make_tensor("wconv", TensorProto.BFLOAT16, [8, 8, 1, 1],
                              onnx.numpy_helper.to_array(bf16).astype(np.float32).reshape(-1).tolist())
    model.graph.initializer.append(bf16)
    model.graph.node.insert(0, helper.make_node("Conv", ["xb", "wconv"], ["xc"]))
    model.graph.node.insert(1, helper.make_node("Cast", ["xc"], ["x"], to=TensorProto.FLOAT))
    model.graph.input[0].CopyFrom(helper.make_tensor_value_info("xb", TensorProto.BFLOAT16, ["N", 8, 5, 6]))
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code, out, _ = _optimize_cli(capsys, src, dst)
    assert code == 1 and "cannot load the original model" in out and "--provider" in out, out
    assert not os.path.exists(dst)


def test_optimizing_in_place(tmp_path, capsys, rng):
    model, p = decomposition_model(rng)
    src = _save(model, tmp_path)
    code, out, _ = _optimize_cli(capsys, src, src)
    assert code == 0, out
    assert (opbridge.DOMAIN, "GroupNorm") in _ops(src)


@pytest.mark.parametrize("large", [False, True])
def test_full_collections_only_for_models_with_large_tensors(tmp_path, capsys, rng, monkeypatch, large):
    """Between its steps, optimize frees a large model's tensors held by reference cycles with a
    full garbage collection (bounded memory: tests/export/test_large_models.py); for a small model
    that frees nothing worth it and walks the whole process's heap (0.25-1 s each in a process with
    torch models loaded): none there."""
    model, _ = decomposition_model(rng)
    if large:
        # An initializer nothing reads brings the model's tensors to the threshold.
        pad = numpy_helper.from_array(rng.standard_normal(_optimize.COLLECT_BYTES // 4).astype(np.float32), "unread")
        model.graph.initializer.append(pad)
    src = _save(model, tmp_path)
    calls = []
    monkeypatch.setattr(_optimize, "gc", type("gc", (), {"collect": staticmethod(lambda: calls.append(1))}))
    code, out, _ = _optimize_cli(capsys, src, str(tmp_path / "out.onnx"))
    assert code == 0 and (opbridge.DOMAIN, "GroupNorm") in _ops(str(tmp_path / "out.onnx")), out
    # Large: after writing, after the original's session, after the rewritten one's.
    assert len(calls) == (3 if large else 0)


@pytest.mark.parametrize("args, message", [
    (["--dim", "N"], "--dim expects NAME=SIZE"),
    (["--dim", "N=-1"], "--dim expects NAME=SIZE"),
    (["--runs", "0"], "--runs must be >= 1"),
    (["--tolerance", "0"], "--tolerance must be > 0"),
])
def test_bad_arguments(tmp_path, capsys, rng, args, message):
    src = _save(decomposition_model(rng)[0], tmp_path)
    code, _, err = _optimize_cli(capsys, src, str(tmp_path / "o.onnx"), *args)
    assert code == 2 and message in err


def test_missing_and_unreadable_inputs(tmp_path, capsys):
    code, _, err = _optimize_cli(capsys, str(tmp_path / "nope.onnx"), str(tmp_path / "o.onnx"))
    assert code == 2 and "no such file" in err
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01 not a model")
    code, _, err = _optimize_cli(capsys, str(bad), str(tmp_path / "o.onnx"))
    assert code == 2 and "cannot read" in err
    assert not (tmp_path / "o.onnx").exists()


def test_runs_without_torch(tmp_path, rng):
    """`opbridge optimize` in a process where torch cannot be imported (as in a deployment with
    only onnxruntime): everything it uses (onnx, onnxscript's rewriter, onnx_ir, ORT) works."""
    model, p = decomposition_model(rng, style="dynamo")
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # import torch raises ImportError\n"
        "from opbridge.cli import main\n"
        f"rc = main(['optimize', {src!r}, {dst!r}])\n"
        "assert sys.modules.get('torch') is None\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "GroupNorm decomposition" in proc.stdout
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    np.testing.assert_allclose(_run_ort(dst, {"x": x})[0], decomposition_ref(x, p), rtol=1e-4, atol=1e-4)


def test_cli_help_lists_optimize():
    proc = subprocess.run([sys.executable, "-m", "opbridge", "optimize", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "--dim" in proc.stdout and "--no-silu" in proc.stdout


# ---------------------------------------------------------------------------------------------
# Fusion at export (torch)
# ---------------------------------------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch")


def _export_cases():
    return [pytest.param(dynamo, opset, id=f"{'dynamo' if dynamo else 'torchscript'}-opset{opset}")
            for dynamo, opset in ((True, 17), (True, 20), (True, 21), (False, 17), (False, 20))]


def _silu_net(torch):
    import torch.nn.functional as F

    import opbridge.nn

    class Net(torch.nn.Module):
        """Every way a GroupNorm + SiLU is written, plus one whose intermediate is read twice."""

        def __init__(self):
            super().__init__()
            self.gn1 = torch.nn.GroupNorm(4, 8)
            self.act = torch.nn.SiLU()
            self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.gn3 = opbridge.nn.GroupNorm(2, 8)
            self.w = torch.nn.Parameter(torch.rand(8) + 0.5)
            self.gn4 = torch.nn.GroupNorm(2, 8)
            with torch.no_grad():
                for gn in (self.gn1, self.gn3, self.gn4):
                    gn.weight.uniform_(0.5, 1.5)
                    gn.bias.uniform_(-0.5, 0.5)

        def forward(self, x):
            y = self.conv(self.act(self.gn1(x)))          # nn.GroupNorm + nn.SiLU
            z = F.group_norm(y, 4, self.w)                  # F.group_norm (no bias) ...
            z = z * torch.sigmoid(z)                        # ... + x * sigmoid(x)
            u = F.silu(self.gn3(z))                         # opbridge.nn.GroupNorm + F.silu
            v = self.gn4(u)                                 # read twice: must stay unfused
            return F.silu(v) + v

    return Net()


def _fused_reference(net, x):
    """float64 reference of _silu_net, from the module's parameters."""
    p = {k: v.detach().double().numpy() for k, v in net.state_dict().items()}
    y = group_norm_act_ref(x, 4, p["gn1.weight"], p["gn1.bias"], activation="silu")
    import torch

    with torch.no_grad():
        y = net.conv.double()(torch.from_numpy(y)).numpy()
    net.conv.float()
    z = group_norm_act_ref(y, 4, p["w"], None, activation="silu")
    u = group_norm_act_ref(z, 2, p["gn3.weight"], p["gn3.bias"], activation="silu")
    v = ref_group_norm(u, 2, p["gn4.weight"], p["gn4.bias"])
    return silu(v) + v


@pytest.mark.torch
@pytest.mark.parametrize("dynamo, opset", _export_cases())
def test_export_fuses_group_norm_and_silu(rng, dynamo, opset):
    torch = _torch()
    torch.manual_seed(int(rng.integers(2**31)))
    net = _silu_net(torch).eval()
    proto = opbridge.onnx.export(net, (torch.randn(2, 8, 6, 5),), dynamo=dynamo, opset_version=opset)
    gns = _gn_nodes(proto)
    assert len(gns) == 4
    assert [_attr(n, "activation") for n in gns] == [b"silu", b"silu", b"silu", None]
    ops = [n.op_type for n in proto.graph.node]
    assert "InstanceNormalization" not in ops and "GroupNormalization" not in ops
    assert ops.count("Sigmoid") == 1  # the unfused one's SiLU
    assert {o.domain: o.version for o in proto.opset_import}[opbridge.DOMAIN] == 2
    assert proto.ir_version <= 9 if opset <= 20 else True
    x = rng.standard_normal((3, 8, 6, 5)).astype(np.float32)
    np.testing.assert_allclose(reference_run(proto, {proto.graph.input[0].name: x})[0], _fused_reference(net, x),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.torch
@needs_ort_silu
@pytest.mark.parametrize("dynamo, opset", _export_cases())
def test_exported_fused_model_matches_torch_in_ort(rng, dynamo, opset):
    torch = _torch()
    torch.manual_seed(int(rng.integers(2**31)))
    net = _silu_net(torch).eval()
    proto = opbridge.onnx.export(net, (torch.randn(2, 8, 6, 5),), dynamo=dynamo, opset_version=opset)
    x = rng.standard_normal((3, 8, 6, 5)).astype(np.float32)
    sess = opbridge.InferenceSession(proto)
    with torch.no_grad():
        expect = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(sess.run(None, {sess.get_inputs()[0].name: x})[0], expect, rtol=1e-4, atol=1e-4)


@pytest.mark.torch
@pytest.mark.parametrize("dynamo, opset", _export_cases())
def test_export_of_a_one_channel_per_group_norm_on_sequences(rng, dynamo, opset):
    """nn.GroupNorm(C, C) on (N, C, L), as in wav2vec2's feature encoder: the dynamo exporter
    writes it without the second Reshape (see test_decomposition_without_the_restoring_reshape...);
    every exporter's form becomes ai.opbridge::GroupNorm, and the model computes what torch does."""
    torch = _torch()
    torch.manual_seed(int(rng.integers(2**31)))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(8, 8, 3)
            self.gn1 = torch.nn.GroupNorm(8, 8)
            self.gn2 = torch.nn.GroupNorm(2, 8)
            with torch.no_grad():
                for gn in (self.gn1, self.gn2):
                    gn.weight.uniform_(0.5, 1.5)
                    gn.bias.uniform_(-0.5, 0.5)

        def forward(self, x):
            return torch.nn.functional.silu(self.gn2(torch.nn.functional.gelu(self.gn1(self.conv(x)))))

    net = Net().eval()
    proto = opbridge.onnx.export(net, (torch.randn(2, 8, 40),), dynamo=dynamo, opset_version=opset)
    ops = [n.op_type for n in proto.graph.node]
    assert [_attr(n, "num_groups") for n in _gn_nodes(proto)] == [8, 2], ops
    assert "InstanceNormalization" not in ops and "GroupNormalization" not in ops
    x = rng.standard_normal((2, 8, 40)).astype(np.float32)
    with torch.no_grad():
        expect = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(reference_run(proto, {proto.graph.input[0].name: x})[0], expect, rtol=1e-4, atol=1e-4)


@pytest.mark.torch
@pytest.mark.parametrize("dynamo, opset", _export_cases()[:2] + _export_cases()[3:4])
def test_bfloat16_export_fuses_group_norm_and_silu(rng, dynamo, opset):
    """A bfloat16 nn.GroupNorm + SiLU becomes one node from every exporter (the dynamo one writes
    CastLike nodes around the affine), and runs in ORT as torch computes it."""
    torch = _torch()
    torch.manual_seed(int(rng.integers(2**31)))
    gn = torch.nn.GroupNorm(4, 16)
    with torch.no_grad():
        gn.weight.uniform_(0.5, 1.5)
        gn.bias.uniform_(-0.5, 0.5)
    net = torch.nn.Sequential(gn, torch.nn.SiLU()).eval().to(torch.bfloat16)
    x = torch.randn(2, 16, 6, 5).to(torch.bfloat16)
    proto = opbridge.onnx.export(net, (x,), dynamo=dynamo, opset_version=opset)
    assert [(d, op) for d, op in _ops(proto) if op not in ("Identity",)] == [(opbridge.DOMAIN, "GroupNorm")], \
        _ops(proto)
    assert _attr(_gn_nodes(proto)[0], "activation") == b"silu"
    # numpy has no bfloat16 that ORT takes: bind the bits as OrtValues of ONNX type BFLOAT16.
    sess = opbridge.InferenceSession(proto)
    xs = torch.from_numpy(rng.standard_normal((2, 16, 6, 5)).astype(np.float32)).to(torch.bfloat16)
    bits = xs.view(torch.int16).numpy().view(np.uint16)
    out = np.full(bits.shape, 0x7FC0, dtype=np.uint16)  # NaN bits
    binding = sess.io_binding()
    binding.bind_ortvalue_input(sess.get_inputs()[0].name,
                                ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, TensorProto.BFLOAT16))
    binding.bind_ortvalue_output(sess.get_outputs()[0].name,
                                 ort.OrtValue.ortvalue_from_numpy_with_onnx_type(out, TensorProto.BFLOAT16))
    sess.run_with_iobinding(binding)
    got = torch.from_numpy(out.view(np.int16)).view(torch.bfloat16).float().numpy()
    expect = group_norm_act_ref(xs.double().numpy(), 4, gn.weight.double().detach().numpy(),
                                gn.bias.double().detach().numpy(), activation="silu")
    np.testing.assert_allclose(got, expect, atol=5e-2, rtol=5e-2)


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [True, False])
def test_export_without_fusion_or_with_standard_lowering_keeps_the_exporters_form(rng, dynamo):
    torch = _torch()
    net = _silu_net(torch).eval()
    x = torch.randn(2, 8, 6, 5)
    plain = opbridge.onnx.export(net, (x,), dynamo=dynamo, fuse=False)
    assert all(_attr(n, "activation") is None for n in _gn_nodes(plain))
    assert [n.op_type for n in plain.graph.node].count("InstanceNormalization") == 3
    standard = opbridge.onnx.export(net, (x,), dynamo=dynamo, lowering="standard")
    assert not _gn_nodes(standard) and opbridge.DOMAIN not in {o.domain for o in standard.opset_import}
    # Both still compute the model (plain: opbridge's node for gn3 without activation).
    xs = rng.standard_normal((2, 8, 6, 5)).astype(np.float32)
    with torch.no_grad():
        expect = net(torch.from_numpy(xs)).numpy()
    for proto in (plain, standard):
        sess = opbridge.InferenceSession(proto)
        np.testing.assert_allclose(sess.run(None, {sess.get_inputs()[0].name: xs})[0], expect, rtol=1e-4, atol=1e-4)


def test_microsoft_reference_when_opbridge_schemas_were_registered_first(tmp_path, rng):
    """onnx's reference evaluator looks schemas up by op name across domains, fixed when it is
    first imported: with ai.opbridge::GroupNorm registered before that, the com.microsoft
    reference must still be used as itself (a fresh process, opbridge.onnx imported first)."""
    model, _, _ = ms_model(rng)
    src, dst = _save(model, tmp_path), str(tmp_path / "out.onnx")
    code = ("import sys, opbridge.onnx\n"
            "from opbridge.cli import main\n"
            f"sys.exit(main(['optimize', {src!r}, {dst!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
