"""torch op opbridge::group_norm: values, gradients, opcheck, errors, nn module, export."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import opbridge  # noqa: E402
import opbridge.nn  # noqa: E402
import opbridge.onnx  # noqa: E402
from helpers.reference import group_norm as ref_group_norm  # noqa: E402

pytestmark = pytest.mark.torch

# (shape, num_groups): the ONNX tutorial's case, a typical conv shape, ranks 2, 3, 5,
# one group, one channel per group, and groups with a single element.
SHAPES = [
    ((3, 2, 1, 2), 2),
    ((2, 64, 16, 16), 32),
    ((4, 6), 3),
    ((2, 8, 7), 4),
    ((2, 4, 3, 2, 5), 2),
    ((3, 5, 9), 1),
    ((2, 6, 4, 4), 6),
    ((5, 3, 1), 3),
]

TOL = {torch.float32: (2e-5, 2e-5), torch.float64: (1e-12, 1e-12)}


def _inputs(rng, shape, dtype, affine=True):
    x = torch.from_numpy(rng.standard_normal(shape) * 3 + 1.5).to(dtype)
    c = shape[1]
    w = torch.from_numpy(rng.uniform(0.5, 2.0, c)).to(dtype) if affine else None
    b = torch.from_numpy(rng.standard_normal(c)).to(dtype) if affine else None
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("shape,groups", SHAPES, ids=[f"{s}-G{g}" for s, g in SHAPES])
@pytest.mark.parametrize("affine", ["both", "none", "weight_only", "bias_only"])
def test_forward_matches_float64_reference(rng, shape, groups, dtype, affine):
    x, w, b = _inputs(rng, shape, dtype)
    if affine in ("none", "bias_only"):
        w = None
    if affine in ("none", "weight_only"):
        b = None
    eps = float(np.float32(rng.uniform(1e-6, 1e-2)))  # float attributes are float32 (docs/declarations.md)
    y = opbridge.ops.group_norm(x, groups, w, b, eps)
    ref = ref_group_norm(x.double().numpy(), groups, None if w is None else w.double().numpy(),
                         None if b is None else b.double().numpy(), eps)
    assert y.dtype == dtype and y.shape == x.shape
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(y.double().numpy(), ref, rtol=rtol, atol=atol)
    # And torch's own implementation, up to its float32 rounding (it can be off where the float64
    # reference and ours agree exactly, e.g. single-element groups: a rounding of x - mean times
    # rstd <= 1/sqrt(eps): 5.8e-5 with OPBRIDGE_TEST_SEED=29962845).
    slack = 4 * 1.2e-7 * float(x.abs().max()) * (1.0 if w is None else float(w.abs().max())) / eps ** 0.5
    torch.testing.assert_close(y, torch.nn.functional.group_norm(x, groups, w, b, eps), rtol=1e-5,
                               atol=max(5e-5, slack))


def test_non_contiguous_and_channels_last_inputs(rng):
    x, w, b = _inputs(rng, (2, 8, 5, 6), torch.float32)
    for xv in (x.transpose(2, 3), x.contiguous(memory_format=torch.channels_last), x[:, :, ::2]):
        y = opbridge.ops.group_norm(xv, 4, w, b)
        torch.testing.assert_close(y, torch.nn.functional.group_norm(xv, 4, w, b))


def test_large_offset_keeps_precision(rng):
    # mean 1e4, unit variance: a one-pass E[x^2] - E[x]^2 in float32 would lose every digit.
    x = torch.from_numpy(rng.standard_normal((2, 4, 32, 32)) + 1e4).float()
    y = opbridge.ops.group_norm(x, 2)
    ref = ref_group_norm(x.double().numpy(), 2)
    np.testing.assert_allclose(y.numpy(), ref, rtol=0, atol=2e-3)


@pytest.mark.parametrize("shape,groups", [((2, 6, 3, 4), 3), ((3, 4, 5), 2), ((2, 4), 4)])
def test_gradcheck(rng, shape, groups):
    x, w, b = _inputs(rng, shape, torch.float64)
    x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w, b: opbridge.ops.group_norm(x, groups, w, b, 1e-4), (x, w, b))
    # Without affine parameters too.
    assert torch.autograd.gradcheck(lambda x: opbridge.ops.group_norm(x, groups, None, None, 1e-4), (x,))


def test_gradients_match_torch(rng):
    x, w, b = _inputs(rng, (3, 8, 4, 5), torch.float64)
    g = torch.from_numpy(rng.standard_normal((3, 8, 4, 5)))
    grads = []
    for fn in (opbridge.ops.group_norm, torch.nn.functional.group_norm):
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
        fn(xs, 4, ws, bs, 1e-5).backward(g)
        grads.append((xs.grad, ws.grad, bs.grad))
    for ours, theirs in zip(*grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)


def test_opcheck(rng):
    x, w, b = _inputs(rng, (2, 6, 3, 3), torch.float32)
    torch.library.opcheck(torch.ops.opbridge.group_norm.default, (x, 3, w, b, 1e-5))
    x64, w64, b64 = _inputs(rng, (2, 6, 5), torch.float64)
    torch.library.opcheck(torch.ops.opbridge.group_norm.default, (x64.requires_grad_(), 2, w64, b64, 1e-3))
    torch.library.opcheck(torch.ops.opbridge.group_norm.default, (x64, 2, None, None, 1e-5))


def test_torch_compile(rng):
    x, w, b = _inputs(rng, (2, 8, 4, 4), torch.float32)
    fn = torch.compile(lambda x: opbridge.ops.group_norm(x, 4, w, b) * 2, fullgraph=True, backend="eager")
    torch.testing.assert_close(fn(x), torch.nn.functional.group_norm(x, 4, w, b) * 2)


@pytest.mark.parametrize(
    "case,exc,match",
    [
        ("not_divisible", ValueError, r"num_groups must divide .*C = x.shape\[1\] = 6, got num_groups = 4"),
        ("zero_groups", ValueError, r"num_groups must be > 0, got 0"),
        ("negative_groups", ValueError, r"num_groups must be > 0, got -2"),
        ("weight_length", ValueError, r"weight must have C = 6 elements .*got 5"),
        ("bias_length", ValueError, r"bias must have C = 6 elements .*got 7"),
        ("rank1", ValueError, r"x must have rank >= 2 .*got rank 1"),
        ("int_dtype", TypeError, r"x must be a float32, float64, float16 or bfloat16 tensor, got int32"),
        ("weight_dtype", TypeError, r"weight must have the dtype of x"),
        ("negative_eps", ValueError, r"eps must be finite and >= 0"),
    ],
)
def test_bad_input_raises_clear_error(rng, case, exc, match):
    x, w, b = _inputs(rng, (2, 6, 3), torch.float32)
    args = {"x": x, "num_groups": 3, "weight": w, "bias": b, "eps": 1e-5}
    if case == "not_divisible":
        args["num_groups"] = 4
    elif case == "zero_groups":
        args["num_groups"] = 0
    elif case == "negative_groups":
        args["num_groups"] = -2
    elif case == "weight_length":
        args["weight"] = w[:5]
    elif case == "bias_length":
        args["bias"] = torch.cat([b, b[:1]])
    elif case == "rank1":
        args["x"] = x.reshape(-1)
        args["weight"] = args["bias"] = None
    elif case == "int_dtype":
        args["x"] = x.int()
    elif case == "weight_dtype":
        args["weight"] = w.double()
    elif case == "negative_eps":
        args["eps"] = -1.0
    with pytest.raises(exc, match=match):
        opbridge.ops.group_norm(**args)


def test_nn_groupnorm_is_a_drop_in(rng):
    ref = torch.nn.GroupNorm(4, 12, eps=1e-4)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(rng.uniform(0.5, 2, 12)))
        ref.bias.copy_(torch.from_numpy(rng.standard_normal(12)))
    ours = opbridge.nn.GroupNorm(4, 12, eps=1e-4)
    assert set(ours.state_dict()) == set(ref.state_dict()) == {"weight", "bias"}
    ours.load_state_dict(ref.state_dict())
    x = torch.from_numpy(rng.standard_normal((3, 12, 5, 5))).float()
    torch.testing.assert_close(ours(x), ref(x))
    assert opbridge.nn.GroupNorm(2, 4, affine=False).weight is None
    # convert() swaps torch modules in place, sharing parameters.
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 12, 1), torch.nn.GroupNorm(4, 12))
    expected = model(x[:, :3])
    opbridge.nn.convert(model)
    assert isinstance(model[1], opbridge.nn.GroupNorm)
    torch.testing.assert_close(model(x[:, :3]), expected)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.gn = opbridge.nn.GroupNorm(4, 8, eps=3e-4)
        self.gn2 = opbridge.nn.GroupNorm(2, 8, affine=False)

    def forward(self, x):
        return self.gn2(torch.relu(self.gn(self.conv(x))))


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_export_and_run_in_ort(rng, tmp_path, dynamo):
    import onnx

    model = _Net().eval()
    with torch.no_grad():
        model.gn.weight.uniform_(0.5, 1.5)
        model.gn.bias.uniform_(-1, 1)
    x = torch.from_numpy(rng.standard_normal((2, 3, 6, 7))).float()
    path = tmp_path / "net.onnx"
    proto = opbridge.onnx.export(model, (x,), path, dynamo=dynamo)
    nodes = [n for n in proto.graph.node if n.domain == "ai.opbridge"]
    assert [n.op_type for n in nodes] == ["GroupNorm", "GroupNorm"]
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in nodes]
    assert attrs[0]["num_groups"] == 2 * 2 and attrs[1]["num_groups"] == 2
    assert attrs[0]["epsilon"] == pytest.approx(3e-4) and attrs[1]["epsilon"] == pytest.approx(1e-5)
    assert {(o.domain, o.version) for o in proto.opset_import} >= {("ai.opbridge", 1)}
    # Batch is dynamic: run with another batch size than at export.
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    sess = opbridge.InferenceSession(str(path))
    x2 = torch.from_numpy(rng.standard_normal((5, 3, 6, 7))).float()
    y = sess.run(None, {sess.get_inputs()[0].name: x2.numpy()})[0]
    with torch.no_grad():
        expected = model(x2).numpy()
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_torch_onnx_export_directly_with_table_and_symbolics(rng, tmp_path, dynamo):
    model = _Net().eval()
    x = torch.from_numpy(rng.standard_normal((2, 3, 4, 4))).float()
    path = tmp_path / "direct.onnx"
    if dynamo:
        torch.onnx.export(model, (x,), path, dynamo=True, custom_translation_table=opbridge.onnx.translation_table())
    else:
        # The scoped form of register_symbolics(), so that the registration ends with the test.
        with opbridge.onnx.symbolics_registered():
            torch.onnx.export(model, (x,), path, dynamo=False, custom_opsets={"ai.opbridge": 1})
    sess = opbridge.InferenceSession(str(path))
    y = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(y, model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_dynamic_spatial_dims_declared_by_user(rng, tmp_path):
    model = _Net().eval()
    x = torch.from_numpy(rng.standard_normal((2, 3, 8, 8))).float()
    batch, h, w = torch.export.Dim("batch"), torch.export.Dim("h"), torch.export.Dim("w")
    path = tmp_path / "dyn.onnx"
    opbridge.onnx.export(model, (x,), path, dynamic_shapes=({0: batch, 2: h, 3: w},))
    sess = opbridge.InferenceSession(str(path))
    x2 = torch.from_numpy(rng.standard_normal((3, 3, 5, 11))).float()
    y = sess.run(None, {sess.get_inputs()[0].name: x2.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(y, model(x2).numpy(), rtol=1e-5, atol=1e-5)
