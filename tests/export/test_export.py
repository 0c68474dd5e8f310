"""opbridge.onnx.export: both lowerings x both exporters x opsets 17/18/20/21.

Every exported model must pass onnx.checker (full_check), carry types and shapes for our nodes,
and match torch (float32 conv net) and the float64 reference (every scale/bias combination) in
ONNX Runtime: custom lowering with opbridge's library, standard lowering on stock ORT.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch")

import opbridge  # noqa: E402
import opbridge.nn  # noqa: E402
import opbridge.onnx  # noqa: E402
from helpers.reference import group_norm as group_norm_ref  # noqa: E402

pytestmark = pytest.mark.torch

OPSETS = (17, 18, 20, 21)
CASES = [
    pytest.param(exporter, opset, id=f"{exporter}-opset{opset}",
                 marks=[pytest.mark.skip(reason="the TorchScript exporter supports opsets <= 20")]
                 if exporter == "torchscript" and opset > 20 else [])
    for exporter in ("dynamo", "torchscript") for opset in OPSETS
]
LOWERINGS = ("custom", "standard")


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            opbridge.nn.GroupNorm(4, 8),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 6, 3, padding=1),
            opbridge.nn.GroupNorm(3, 6, affine=False, eps=1e-3),
        )

    def forward(self, x):
        return self.body(x).sigmoid()


class EveryAffineCombination(torch.nn.Module):
    """Four group norms: scale+bias, neither, scale only, bias only (optional inputs in the middle)."""

    def __init__(self, c: int, rng: np.random.Generator, dtype) -> None:
        super().__init__()
        for name in ("w1", "b1", "w2", "b2"):
            lo, hi = (0.5, 1.5) if name.startswith("w") else (-0.5, 0.5)
            self.register_buffer(name, torch.tensor(rng.uniform(lo, hi, c), dtype=dtype))

    def forward(self, x):
        gn = opbridge.ops.group_norm
        x = gn(x, 2, self.w1, self.b1)
        x = gn(x, 4, None, None, 1e-3)
        x = gn(x, 1, self.w2, None)
        return gn(x, 2, None, self.b2)

    def reference(self, x: np.ndarray) -> np.ndarray:
        # Epsilon reaches ONNX as a float32 attribute: the reference uses the same values.
        eps = [float(np.float32(e)) for e in (1e-5, 1e-3, 1e-5, 1e-5)]
        y = group_norm_ref(x, 2, self.w1.numpy(), self.b1.numpy(), eps[0])
        y = group_norm_ref(y, 4, None, None, eps[1])
        y = group_norm_ref(y, 1, self.w2.numpy(), None, eps[2])
        return group_norm_ref(y, 2, None, self.b2.numpy(), eps[3])


def _export(model, x, exporter, opset, lowering):
    return opbridge.onnx.export(model.eval(), (x,), dynamo=exporter == "dynamo", opset_version=opset, lowering=lowering)


def _run(proto, lowering, x: np.ndarray) -> np.ndarray:
    if lowering == "custom":
        sess = opbridge.InferenceSession(proto)
    else:
        # Stock ONNX Runtime: no opbridge library registered.
        sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def _typed_values(proto) -> dict[str, onnx.TypeProto]:
    g = proto.graph
    return {vi.name: vi.type for vi in (*g.value_info, *g.output)}


def _check_structure(proto, opset: int, lowering: str, n_group_norms: int, rank: int) -> None:
    onnx.checker.check_model(proto, full_check=True)
    imports = {o.domain: o.version for o in proto.opset_import}
    assert imports.get("", imports.get("ai.onnx")) == opset
    # Opsets up to 20 load on ONNX Runtime 1.17, which refuses IR 10.
    if opset <= 20:
        assert proto.ir_version <= 9
    ops = [n.op_type for n in proto.graph.node]
    custom = [n for n in proto.graph.node if n.domain == opbridge.DOMAIN]
    if lowering == "custom":
        assert [n.op_type for n in custom] == ["GroupNorm"] * n_group_norms
        assert imports[opbridge.DOMAIN] == opbridge.onnx.DOMAIN_VERSION
        # Self-describing: every output of our nodes has its type and full-rank shape in the model.
        typed = _typed_values(proto)
        for node in custom:
            t = typed[node.output[0]].tensor_type
            assert t.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)
            assert len(t.shape.dim) == rank
    else:
        assert not custom and opbridge.DOMAIN not in imports
        if opset >= 21:
            assert ops.count("GroupNormalization") == n_group_norms
        else:
            assert "GroupNormalization" not in ops  # never GroupNormalization-18 (per-group affine)


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("exporter, opset", CASES)
def test_conv_net_matches_torch(rng, exporter, opset, lowering):
    torch.manual_seed(int(rng.integers(2**31)))
    model = ConvNet().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, opbridge.nn.GroupNorm) and m.affine:
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    proto = _export(model, torch.randn(2, 3, 10, 12), exporter, opset, lowering)
    _check_structure(proto, opset, lowering, n_group_norms=2, rank=4)
    # Another batch size than at export: the batch dimension is dynamic.
    x = rng.standard_normal((3, 3, 10, 12)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_run(proto, lowering, x), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("exporter, opset", CASES)
def test_every_affine_combination_matches_float64_reference(rng, exporter, opset, lowering):
    model = EveryAffineCombination(8, rng, torch.float64)
    proto = _export(model, torch.randn(2, 8, 5, dtype=torch.float64), exporter, opset, lowering)
    _check_structure(proto, opset, lowering, n_group_norms=4, rank=3)
    x = rng.standard_normal((3, 8, 5)) * 3 + 1
    # The standard lowering computes with ORT's float64 ReduceMean/Sqrt/Div chain, which lands a
    # few 1e-10 off the reference on unlucky draws; opbridge's own kernel stays within 1e-10.
    tol = 1e-10 if lowering == "custom" else 1e-9
    np.testing.assert_allclose(_run(proto, lowering, x), model.reference(x), rtol=tol, atol=tol)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_per_op_lowering(rng, exporter):
    model = ConvNet().eval()
    x = torch.randn(1, 3, 6, 6)
    dynamo = exporter == "dynamo"
    standard = opbridge.onnx.export(model, (x,), dynamo=dynamo, opset_version=18, lowering={"group_norm": "standard"})
    custom = opbridge.onnx.export(model, (x,), dynamo=dynamo, opset_version=18, lowering={"group_norm": "custom"})
    assert not [n for n in standard.graph.node if n.domain == opbridge.DOMAIN]
    assert [n.op_type for n in custom.graph.node if n.domain == opbridge.DOMAIN] == ["GroupNorm"] * 2
    xs = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(_run(standard, "standard", xs), _run(custom, "custom", xs), rtol=1e-4, atol=1e-5)


def test_bad_lowering_is_rejected():
    model, x = ConvNet().eval(), torch.randn(1, 3, 4, 4)
    with pytest.raises(ValueError, match="unknown op 'grop_norm'"):
        opbridge.onnx.export(model, (x,), lowering={"grop_norm": "standard"})
    with pytest.raises(ValueError, match="lowering for 'group_norm' must be one of"):
        opbridge.onnx.export(model, (x,), lowering={"group_norm": "fast"})
    with pytest.raises(ValueError, match="lowering must be one of"):
        opbridge.onnx.export(model, (x,), lowering="fast")


@pytest.mark.parametrize("exporter, default", [("dynamo", 20), ("torchscript", 17)])
def test_default_opset(exporter, default):
    proto = opbridge.onnx.export(ConvNet().eval(), (torch.randn(1, 3, 4, 4),), dynamo=exporter == "dynamo",
                                 lowering="standard")
    assert {o.domain: o.version for o in proto.opset_import}[""] == default
    assert "GroupNormalization" not in [n.op_type for n in proto.graph.node]


def test_half_precision_standard_lowering_computes_in_float32(rng):
    model = EveryAffineCombination(8, rng, torch.float16)
    for opset in (18, 21):
        proto = _export(model, torch.randn(2, 8, 5, dtype=torch.float16), "dynamo", opset, "standard")
        onnx.checker.check_model(proto, full_check=True)
        x = (rng.standard_normal((3, 8, 5)) * 3 + 1).astype(np.float16)
        y = _run(proto, "standard", x)
        assert y.dtype == np.float16
        np.testing.assert_allclose(y.astype(np.float64), model.reference(x.astype(np.float64)), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("x_shape,error,match", [
    ((2, 6, 3), ValueError, r"^opbridge::group_norm: weight must have C = 6 elements \(one per channel\), got 4$"),
    ((4,), ValueError, r"^opbridge::group_norm: x must have rank >= 2 \(N, C, \*\), got rank 1$"),
])
def test_a_model_that_calls_an_op_wrongly_gets_the_ops_verdict_from_both_exporters(tmp_path, x_shape, error, match):
    # Eager torch, the TorchScript exporter and the dynamo exporter (which fails inside torch.export,
    # in the op's fake kernel) raise the op's own error: the model, not the exporter, is what is wrong.
    model = torch.nn.Sequential(opbridge.nn.GroupNorm(2, 4)).eval()
    x = torch.randn(*x_shape)
    with pytest.raises(error, match=match):
        model(x)
    for dynamo in (False, True):
        with pytest.raises(error, match=match):
            opbridge.onnx.export(model, (x,), tmp_path / "m.onnx", dynamo=dynamo)
