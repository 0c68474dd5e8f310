"""GroupNorm in float16 / bfloat16 on the CPU (statistics in float32), through the torch op, the
ORT op and opbridge._core, against the float64 reference of the same rounded inputs."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import opbridge

from helpers import onnx_models
from helpers import reference as ref

ml_dtypes = pytest.importorskip("ml_dtypes")

HAS_TORCH = importlib.util.find_spec("torch") is not None
NP_DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# One output rounding (half: 2^-11, bfloat16: 2^-8 relative) after float32 statistics; absolute,
# relative to max(1, |reference|).
TOL = {"float16": 2e-3, "bfloat16": 1.6e-2}
CASES = [((2, 4), 4), ((3, 6, 7), 3), ((2, 8, 5, 5), 4), ((1, 32, 40, 40), 8), ((2, 6, 3001), 2)]
IDS = [f"{s}-G{g}" for s, g in CASES]


def _inputs(rng, shape, dtype, affine=True):
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(NP_DTYPES[dtype])
    if not affine:
        return x, None, None
    w = rng.standard_normal(shape[1]).astype(NP_DTYPES[dtype])
    b = rng.standard_normal(shape[1]).astype(NP_DTYPES[dtype])
    return x, w, b


def _f64(a):
    return None if a is None else np.asarray(a).astype(np.float64)


def _check(got, x, groups, w, b, dtype):
    expect = ref.group_norm(_f64(x), groups, _f64(w), _f64(b))
    got = np.asarray(got).astype(np.float64)
    assert got.shape == expect.shape
    np.testing.assert_allclose(got, expect, rtol=0, atol=TOL[dtype] * max(1.0, np.abs(expect).max()))


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("shape,groups", CASES, ids=IDS)
@pytest.mark.parametrize("affine", [True, False])
def test_core(rng, dtype, shape, groups, affine):
    from opbridge import _core

    x, w, b = _inputs(rng, shape, dtype, affine)
    y = _core.group_norm(x, groups, w, b, 1e-5)
    assert y.dtype == NP_DTYPES[dtype]
    _check(y, x, groups, w, b, dtype)


@pytest.mark.torch
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("shape,groups", CASES, ids=IDS)
@pytest.mark.parametrize("affine", [True, False])
def test_torch_op(rng, dtype, shape, groups, affine):
    import torch

    td = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    x, w, b = _inputs(rng, shape, dtype, affine)
    to_t = lambda a: None if a is None else torch.from_numpy(a.astype(np.float32)).to(td)  # exact: widening
    y = torch.ops.opbridge.group_norm(to_t(x), groups, to_t(w), to_t(b), 1e-5)
    assert y.dtype == td
    _check(y.float().numpy(), x, groups, w, b, dtype)


@pytest.mark.torch
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_torch_op_gradients(rng, dtype):
    import torch

    td = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    x64 = torch.from_numpy(rng.standard_normal((2, 6, 4, 5)))
    w64 = torch.from_numpy(rng.standard_normal(6))
    g64 = torch.from_numpy(rng.standard_normal((2, 6, 4, 5)))
    x, w, g = (t.to(td) for t in (x64, w64, g64))
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    opbridge.ops.group_norm(xs, 3, ws, None, 1e-5).backward(g)
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    torch.nn.functional.group_norm(xr, 3, wr, None, 1e-5).backward(g.double())
    scale = {"float16": 4e-3, "bfloat16": 3e-2}[dtype]
    for got, want in ((xs.grad, xr.grad), (ws.grad, wr.grad)):
        assert got.dtype == td
        np.testing.assert_allclose(got.double().numpy(), want.numpy(), rtol=0,
                                   atol=scale * max(1.0, want.abs().max().item()))


def _ort_run(model, feeds, out_shape, dtype):
    """Runs through IO binding with OrtValues typed by ONNX element type (numpy has no
    bfloat16 ORT can take), into a NaN-poisoned output buffer."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto

    et = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}[dtype]
    sess = opbridge.InferenceSession(onnx_models.serialize(model))
    binding = sess.io_binding()
    keep = []
    for name, a in feeds.items():
        bits = np.ascontiguousarray(a).view(np.uint16)
        keep.append(bits)
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, et))
    out = np.full(out_shape, 0x7FC0 if dtype == "bfloat16" else 0x7E00, dtype=np.uint16)  # NaN bits
    binding.bind_ortvalue_output("Y", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(out, et))
    sess.run_with_iobinding(binding)
    return out.view(NP_DTYPES[dtype])


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("shape,groups", CASES, ids=IDS)
def test_ort(rng, dtype, shape, groups):
    from onnx import TensorProto, helper

    x, w, b = _inputs(rng, shape, dtype)
    et = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}[dtype]
    node = helper.make_node("GroupNorm", ["X", "scale", "bias"], ["Y"], domain=opbridge.DOMAIN,
                            num_groups=groups, epsilon=1e-5)
    graph = helper.make_graph(
        [node], "gn",
        [helper.make_tensor_value_info("X", et, list(shape)), helper.make_tensor_value_info("scale", et, [shape[1]]),
         helper.make_tensor_value_info("bias", et, [shape[1]])],
        [helper.make_tensor_value_info("Y", et, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", onnx_models.DEFAULT_OPSET), helper.make_opsetid(opbridge.DOMAIN, 1)],
        ir_version=onnx_models.IR_VERSION,
    )
    y = _ort_run(model, {"X": x, "scale": w, "bias": b}, shape, dtype)
    _check(y, x, groups, w, b, dtype)
