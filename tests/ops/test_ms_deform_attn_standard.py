"""lowering="standard" for opbridge::ms_deform_attn: a per-level GridSample decomposition that stock
ONNX Runtime (no opbridge library) loads and runs, compared with the float64 reference, with both
exporters, a dynamic batch and query count, and image sizes only known at run time."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import opbridge
from helpers.msda_inputs import f64, make_inputs
from test_ms_deform_attn_export import _attn_module, _dynamic, _encoder_attention, _torch

EXPORTERS = pytest.mark.parametrize("dynamo", (True, False), ids=["dynamo", "torchscript"])


def _stock_session(proto):
    """A plain ORT session: loading proves no custom-op library is needed."""
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _check_standard_only(proto):
    assert all(n.domain in ("", "ai.onnx") for n in proto.graph.node), {n.domain for n in proto.graph.node}
    assert "GridSample" in {n.op_type for n in proto.graph.node}
    onnx.checker.check_model(proto, full_check=True)


@pytest.mark.torch
@EXPORTERS
@pytest.mark.parametrize("opset", [16, 18])
def test_standard_lowering_parity(rng, dynamo, opset):
    from helpers import reference

    model = _attn_module()
    levels = [(6, 5), (3, 4), (1, 1), (1, 3)]
    args = make_inputs(rng, levels, 2, 2, 4, 7, 3, "float32")
    proto = opbridge.onnx.export(model, _torch(args), dynamo=dynamo, lowering="standard", opset_version=opset,
                                 **_dynamic(dynamo))
    _check_standard_only(proto)
    sess = _stock_session(proto)
    for n, lq in ((2, 7), (3, 11)):  # the exported batch and query count, and others
        other = make_inputs(rng, levels, n, 2, 4, lq, 3, "float32")
        got = sess.run(None, dict(zip([i.name for i in sess.get_inputs()], other)))[0]
        assert got.shape == (n, lq, 8) and got.dtype == np.float32
        expect = reference.ms_deform_attn(f64(other[0]), other[1], other[2], f64(other[3]), f64(other[4]))
        np.testing.assert_allclose(got, expect, rtol=1e-5, atol=2e-5)


@pytest.mark.torch
@EXPORTERS
def test_standard_lowering_float64_computes_in_float32(rng, dynamo):
    from helpers import reference

    model = _attn_module()
    levels = [(4, 3), (2, 2)]
    args = make_inputs(rng, levels, 2, 2, 4, 5, 2, "float64")
    proto = opbridge.onnx.export(model, _torch(args), dynamo=dynamo, lowering="standard", opset_version=17, dynamic_batch=False)
    sess = _stock_session(proto)
    got = sess.run(None, dict(zip([i.name for i in sess.get_inputs()], args)))[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, reference.ms_deform_attn(*args), rtol=1e-5, atol=2e-5)


@pytest.mark.torch
@EXPORTERS
def test_standard_lowering_dynamic_image_size(rng, dynamo):
    """Level sizes computed inside the graph (as transformers does): one model runs other sizes."""
    import torch
    from torch.export import Dim

    if dynamo:
        def shapes_of(feats):
            return torch.stack([torch.tensor([f.shape[-2], f.shape[-1]]) for f in feats])
        kw = {"dynamic_shapes": tuple({0: Dim("batch"), 2: Dim(f"h{i}", min=2), 3: Dim(f"w{i}", min=2)}
                                      for i in range(3))}
    else:
        def shapes_of(feats):
            return torch.stack([torch._shape_as_tensor(f)[-2:] for f in feats])
        kw = {"dynamic_axes": {f"f{i}": {0: "batch", 2: f"h{i}", 3: f"w{i}"} for i in range(3)},
              "input_names": ["f0", "f1", "f2"]}
    torch.manual_seed(int(rng.integers(2**31)))
    model = _encoder_attention(shapes_of)().eval()
    feats = tuple(torch.randn(2, 16, h, w) for h, w in ((8, 10), (4, 5), (2, 3)))
    proto = opbridge.onnx.export(model, feats, dynamo=dynamo, lowering="standard", **kw)
    _check_standard_only(proto)
    sess = _stock_session(proto)
    for sizes in (((6, 9), (3, 5), (2, 2)), ((8, 10), (4, 5), (2, 3))):
        other = tuple(torch.randn(3, 16, h, w) for h, w in sizes)
        got = sess.run(None, {i.name: f.numpy() for i, f in zip(sess.get_inputs(), other)})[0]
        np.testing.assert_allclose(got, model(*other).detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.torch
def test_standard_lowering_below_opset_16_is_refused(rng):
    model = _attn_module()
    args = make_inputs(rng, [(2, 2)], 1, 1, 2, 3, 1, "float32")
    with pytest.raises(NotImplementedError, match="opset >= 16"):
        opbridge.onnx.export(model, _torch(args), dynamo=False, lowering="standard", opset_version=15,
                             dynamic_batch=False)
