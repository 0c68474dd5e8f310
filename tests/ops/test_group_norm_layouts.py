"""GroupNorm's memory formats (contiguous / channels-last) and fused activation (none / silu) in the
torch op: values and gradients against float64 references, strides (eager = fake), higher-order
gradients, opcheck, torch.compile / torch.export, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import opbridge  # noqa: E402
import opbridge.ops  # noqa: E402
from opbridge.ops.group_norm import _group_norm_backward_composite  # noqa: E402
from helpers.reference import group_norm as ref_group_norm  # noqa: E402
from helpers.reference import group_norm_backward as ref_group_norm_backward  # noqa: E402

pytestmark = pytest.mark.torch

ACTS = ["none", "silu"]
DTYPES = {"float32": 2e-5, "float64": 1e-12, "float16": 4e-3, "bfloat16": 3e-2}


def _to_layout(x, layout):
    """x (contiguous) in the memory format `layout`."""
    if layout == "contiguous":
        return x
    if layout == "channels_last":  # NHWC / NDHWC, or (N, L, C) memory for rank 3
        order = (0, *range(2, x.dim()), 1)
        inv = [order.index(i) for i in range(x.dim())]
        return x.permute(order).contiguous().permute(inv)
    if layout == "one_sample_cl_view":  # (N, *spatial, C) memory with batch stride C (N = 1), as an
        # attention block's output view: torch counts it contiguous-like, and so does the op.
        order = (0, *range(2, x.dim()), 1)
        inv = [order.index(i) for i in range(x.dim())]
        y = x.permute(order).contiguous().permute(inv)
        return y.as_strided(y.shape, (y.shape[1],) + y.stride()[1:]) if y.shape[0] == 1 else y
    if layout == "strided":  # neither (every other sample of a bigger buffer): made contiguous by the op
        big = x.new_zeros((2 * x.shape[0],) + tuple(x.shape[1:]))
        big[::2] = x
        return big[::2]
    raise ValueError(layout)


def _layout_strides(t):
    return tuple(st for st, n in zip(t.stride(), t.shape) if n > 1)


def _is_channels_last(t):
    order = (0, *range(2, t.dim()), 1)
    return t.permute(order).is_contiguous()


# (shape, groups): the NHWC kernel's paths: many small samples (one task each), few samples (tiles
# in waves), big samples (several tiles), C not a multiple of the vector width, one group, one
# channel per group, rank 3 and 5.
SHAPES = [
    ((8, 32, 6, 5), 8),
    ((2, 64, 16, 16), 32),
    ((1, 48, 80, 70), 4),
    ((3, 20, 7, 9), 5),
    ((2, 6, 5, 4), 1),
    ((2, 6, 3, 3), 6),
    ((3, 12, 17), 4),
    ((2, 8, 3, 4, 5), 2),
]
IDS = [f"{s}-G{g}" for s, g in SHAPES]


def _inputs(rng, shape, dtype=torch.float64, offset=0.5):
    x = torch.from_numpy(rng.standard_normal(shape) * 2 + offset).to(dtype)
    w = torch.from_numpy(rng.uniform(0.5, 2.0, shape[1])).to(dtype)
    b = torch.from_numpy(rng.standard_normal(shape[1])).to(dtype)
    return x, w, b


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape,groups", SHAPES, ids=IDS)
def test_forward_matches_reference(rng, shape, groups, dtype, layout, act):
    tdt = getattr(torch, dtype)
    x, w, b = _inputs(rng, shape, tdt)
    xl = _to_layout(x, layout)
    eps = float(np.float32(rng.uniform(1e-6, 1e-3)))  # float attributes are float32 (docs/declarations.md)
    y = opbridge.ops.group_norm(xl, groups, w, b, eps, activation=act)
    ref = ref_group_norm(x.double().numpy(), groups, w.double().numpy(), b.double().numpy(), eps, act)
    assert y.dtype == tdt and y.shape == x.shape
    tol = DTYPES[dtype]
    np.testing.assert_allclose(y.double().numpy(), ref, rtol=tol, atol=tol * 4)
    # The result keeps a channels-last input's memory format; anything else comes back contiguous.
    if layout == "channels_last" and not xl.is_contiguous():
        assert _is_channels_last(y) and y.stride() == xl.stride()
    else:
        assert y.is_contiguous()


@pytest.mark.parametrize("act", ACTS)
def test_samples_beyond_the_cache_budget_in_several_waves(rng, act):
    # Three float32 samples of 3 MiB: each beyond the NHWC kernel's cache budget (half the L2,
    # at most 2 MiB on the CPUs this runs on), so they are cut into tiles and processed in waves
    # of at most four budgets: at least two waves, the second starting at a sample other than 0.
    x, w, b = _inputs(rng, (3, 96, 64, 128), torch.float32)
    xl = _to_layout(x, "channels_last")
    y = opbridge.ops.group_norm(xl, 32, w, b, 1e-5, activation=act)
    ref = ref_group_norm(x.double().numpy(), 32, w.double().numpy(), b.double().numpy(), 1e-5, act)
    assert _is_channels_last(y)
    np.testing.assert_allclose(y.double().numpy(), ref, rtol=2e-5, atol=8e-5)


@pytest.mark.parametrize("groups", [32, 16])
def test_few_channels_per_group_far_from_zero_over_many_blocks(rng, groups):
    # Channels-last statistics over several blocks of rows (hundreds of rows each where C is
    # small), one or two channels per group, every channel at its own mean in +-1e4 and drifting
    # along the rows (so later blocks lie away from the running mean and are summed again around
    # their own): float32 results within float32 rounding of the float64 reference.
    n, c, h, w_ = 2, 32, 48, 40
    drift = np.linspace(0.0, 40.0, h * w_).reshape(1, 1, h, w_)
    x = rng.standard_normal((n, c, h, w_)) + rng.uniform(-1e4, 1e4, (n, c, 1, 1)) + drift
    x = torch.from_numpy(x.astype(np.float32))
    w = torch.from_numpy(rng.uniform(0.5, 2.0, c).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal(c).astype(np.float32))
    y = opbridge.ops.group_norm(_to_layout(x, "channels_last"), groups, w, b, 1e-5)
    ref = ref_group_norm(x.double().numpy(), groups, w.double().numpy(), b.double().numpy(), 1e-5, "none")
    np.testing.assert_allclose(y.double().numpy(), ref, rtol=0, atol=2e-5 * (1 + np.abs(ref)).max())


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("affine", [True, False])
def test_no_weight_or_bias(rng, act, affine):
    x, w, b = _inputs(rng, (3, 16, 9, 7), torch.float32)
    xl = _to_layout(x, "channels_last")
    w, b = (w, None) if affine else (None, b)
    y = opbridge.ops.group_norm(xl, 4, w, b, activation=act)
    ref = ref_group_norm(x.double().numpy(), 4, None if w is None else w.double().numpy(),
                         None if b is None else b.double().numpy(), 1e-5, act)
    np.testing.assert_allclose(y.double().numpy(), ref, rtol=2e-5, atol=8e-5)


def test_channels_last_matches_torch_and_keeps_format(rng):
    x, w, b = _inputs(rng, (2, 32, 12, 10), torch.float32)
    xl = x.contiguous(memory_format=torch.channels_last)
    y = opbridge.ops.group_norm(xl, 8, w, b, activation="silu")
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, torch.nn.functional.silu(torch.nn.functional.group_norm(x, 8, w, b)))
    x3 = x[:, :, :4, :5].unsqueeze(2).contiguous(memory_format=torch.channels_last_3d)
    y3 = opbridge.ops.group_norm(x3, 8, w, b)
    assert y3.is_contiguous(memory_format=torch.channels_last_3d)
    torch.testing.assert_close(y3, torch.nn.functional.group_norm(x3.contiguous(), 8, w, b))


def test_silu_non_finite_values_follow_torch():
    # An infinite bias makes the pre-activation +-inf: silu(inf) = inf, silu(-inf) = NaN (torch);
    # a very negative pre-activation gives -0.
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0], [1.0, -2.0, 0.5, 3.0], [0.0, 1.0, 2.0, 3.0]]])
    b = torch.tensor([float("inf"), float("-inf"), -200.0])
    for dtype in (torch.float32, torch.float64):
        y = opbridge.ops.group_norm(x.to(dtype), 3, None, b.to(dtype), activation="silu")
        ref = torch.nn.functional.silu(torch.nn.functional.group_norm(x.double(), 3, None, b.double()))
        torch.testing.assert_close(y.double(), ref, equal_nan=True)


# ---- gradients ---------------------------------------------------------------------------------


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,groups", [((2, 16, 5, 6), 4), ((1, 48, 40, 30), 8), ((3, 6, 11), 3)])
def test_gradients_match_reference(rng, shape, groups, dtype, layout, act):
    tdt = getattr(torch, dtype)
    x, w, b = _inputs(rng, shape, tdt)
    g = torch.from_numpy(rng.standard_normal(shape)).to(tdt)
    xl = _to_layout(x.clone(), layout).requires_grad_()
    ws, bs = w.clone().requires_grad_(), b.clone().requires_grad_()
    opbridge.ops.group_norm(xl, groups, ws, bs, 1e-4, act).backward(_to_layout(g, layout))
    dx, dw, db = ref_group_norm_backward(x.double().numpy(), groups, w.double().numpy(), g.double().numpy(), 1e-4,
                                         bias=b.double().numpy(), activation=act)
    tol = 1e-10 if dtype == "float64" else 1e-4
    for got, want in ((xl.grad, dx), (ws.grad, dw), (bs.grad, db)):
        np.testing.assert_allclose(got.double().numpy(), want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))
    if layout == "channels_last" and len(shape) > 3:
        assert _is_channels_last(xl.grad)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_16bit_gradients(rng, dtype, layout):
    tdt = getattr(torch, dtype)
    x, w, b = _inputs(rng, (2, 8, 6, 5), torch.float64)
    g = torch.from_numpy(rng.standard_normal((2, 8, 6, 5)))
    xs = _to_layout(x.to(tdt), layout).requires_grad_()
    ws = w.to(tdt).requires_grad_()
    opbridge.ops.group_norm(xs, 4, ws, b.to(tdt), 1e-5, "silu").backward(g.to(tdt))
    dx, dw, _ = ref_group_norm_backward(x.to(tdt).double().numpy(), 4, w.to(tdt).double().numpy(),
                                        g.to(tdt).double().numpy(), 1e-5, bias=b.to(tdt).double().numpy(),
                                        activation="silu")
    scale = {"float16": 5e-3, "bfloat16": 4e-2}[dtype]
    for got, want in ((xs.grad, dx), (ws.grad, dw)):
        assert got.dtype == tdt
        np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=scale * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_gradcheck(rng, layout, act):
    x, w, b = _inputs(rng, (2, 6, 3, 4), torch.float64)
    x = _to_layout(x, layout).requires_grad_()
    w.requires_grad_(), b.requires_grad_()
    fn = lambda x, w, b: opbridge.ops.group_norm(x, 3, w, b, 1e-4, act)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, b))


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("affine", ["both", "none", "weight_only", "bias_only"])
def test_gradgradcheck(rng, layout, act, affine):
    # Second-order gradients (issue: the C++ backward has no derivative; under create_graph the
    # backward is computed by differentiable torch ops). Fails when the backward's own gradient
    # is missing or wrong.
    x, w, b = _inputs(rng, (2, 4, 2, 3), torch.float64)
    x = _to_layout(x, layout).requires_grad_()
    params = {"both": (w, b), "none": (None, None), "weight_only": (w, None), "bias_only": (None, b)}[affine]
    groups = 2
    args = [x] + [p.requires_grad_() for p in params if p is not None]

    def fn(x, *p):
        it = iter(p)
        weight = next(it) if params[0] is not None else None
        bias = next(it) if params[1] is not None else None
        if act == "none":
            return opbridge.ops.group_norm(x, groups, weight, bias, 1e-4)  # the 5-argument call
        return opbridge.ops.group_norm(x, groups, weight, bias, 1e-4, act)

    assert torch.autograd.gradgradcheck(fn, tuple(args))


def test_second_order_gradients_match_torch(rng):
    # d/dx of the squared gradient norm, a typical gradient-penalty term, against F.group_norm.
    x, w, b = _inputs(rng, (2, 8, 5, 5), torch.float64)
    outs = []
    for fn in (lambda x, w, b: opbridge.ops.group_norm(x, 4, w, b, 1e-5, "silu"),
               lambda x, w, b: torch.nn.functional.silu(torch.nn.functional.group_norm(x, 4, w, b, 1e-5))):
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
        (gx,) = torch.autograd.grad(fn(xs, ws, bs).pow(2).sum(), xs, create_graph=True)
        outs.append(torch.autograd.grad(gx.pow(2).sum(), (xs, ws, bs)))
    for ours, theirs in zip(*outs):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-9)


def test_backward_op_has_no_silent_derivative(rng):
    x, w, b = _inputs(rng, (2, 4, 3), torch.float64)
    x.requires_grad_()
    dx, _, _ = torch.ops.opbridge.group_norm_backward(torch.ones_like(x), x, 2, w, b, 1e-5, "none")
    with pytest.raises(RuntimeError, match="group_norm_backward has no derivative"):
        dx.sum().backward()


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_composite_backward_matches_kernel(rng, layout, act):
    # The torch-op backward (CUDA's, and the differentiable one) against the C++ kernel.
    x, w, b = _inputs(rng, (2, 12, 5, 7), torch.float64)
    x = _to_layout(x, layout)
    g = _to_layout(torch.from_numpy(rng.standard_normal((2, 12, 5, 7))), layout)
    for weight in (w, None):
        ours = torch.ops.opbridge.group_norm_backward(g, x, 3, weight, b, 1e-5, act)
        comp = _group_norm_backward_composite(g, x, 3, weight, b, 1e-5, act)
        for o, c in zip(ours, comp):
            torch.testing.assert_close(o, c, rtol=1e-10, atol=1e-10)
            assert o.stride() == c.stride()


# ---- fake kernel, opcheck, compile, export ------------------------------------------------------


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided", "one_sample_cl_view"])
@pytest.mark.parametrize("shape", [(2, 8, 3, 4), (2, 8, 1, 1), (2, 1, 3, 4), (2, 8, 5), (1, 8, 2, 3, 2),
                                   (1, 8, 3, 4)])
def test_fake_kernel_strides_equal_the_real_ones(rng, shape, layout, act):
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, w, b = _inputs(rng, shape, torch.float32)
    xl = _to_layout(x, layout)
    y = opbridge.ops.group_norm(xl, 1, w, b, 1e-5, act)
    with FakeTensorMode() as mode:
        fx, fw, fb = (mode.from_tensor(t) for t in (xl, w, b))
        fy = opbridge.ops.group_norm(fx, 1, fw, fb, 1e-5, act)
        fg = torch.ops.opbridge.group_norm_backward(mode.from_tensor(y), fx, 1, fw, fb, 1e-5, act)
    assert fy.shape == y.shape and fy.stride() == y.stride()
    dx = torch.ops.opbridge.group_norm_backward(y, xl, 1, w, b, 1e-5, act)[0]
    assert fg[0].stride() == dx.stride()
    ym = opbridge.ops.group_norm(xl.to("meta"), 1, w.to("meta"), b.to("meta"), 1e-5, act)
    assert ym.stride() == y.stride()


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided", "one_sample_cl_view"])
@pytest.mark.parametrize("shape", [(2, 8, 3, 4), (1, 8, 3, 4), (1, 8, 2, 3, 2), (3, 8, 1, 5)])
def test_result_memory_format_is_torchs(rng, shape, layout):
    # The next layer's speed depends on the layout it receives (a convolution copies an input
    # whose memory format differs from what it expects): give what torch's own F.group_norm gives
    # (a 4-D/5-D tensor's suggested memory format), values and gradients included.
    x, w, b = _inputs(rng, shape, torch.float32)
    xl = _to_layout(x, layout).requires_grad_()
    xt = _to_layout(x, layout).requires_grad_()
    assert xt.stride() == xl.stride()
    ours = opbridge.ops.group_norm(xl, 4, w, b, 1e-5)
    theirs = torch.nn.functional.group_norm(xt, 4, w, b, 1e-5)
    assert ours.stride() == theirs.stride()
    torch.testing.assert_close(ours, theirs, rtol=2e-5, atol=2e-5)
    g = _to_layout(torch.from_numpy(rng.standard_normal(shape)).float(), layout)
    ours.backward(g)
    theirs.backward(g)
    # The strides of dimensions of size > 1: the memory layout. (torch 2.14's F.group_norm gives a
    # one-sample input's gradient that input's own batch stride, e.g. 192 for a (1, 8, 3, 4) slice of
    # a (2, 8, 3, 4) buffer, where earlier releases and opbridge give 96; a size-1 dimension's stride
    # says nothing about the layout.)
    assert _layout_strides(xl.grad) == _layout_strides(xt.grad)
    torch.testing.assert_close(xl.grad, xt.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_opcheck(rng, layout, act):
    x, w, b = _inputs(rng, (2, 6, 3, 3), torch.float32)
    x = _to_layout(x, layout)
    torch.library.opcheck(torch.ops.opbridge.group_norm.default, (x, 3, w, b, 1e-5, act))
    x64, w64, b64 = _inputs(rng, (2, 6, 4, 5), torch.float64)
    x64 = _to_layout(x64, layout).requires_grad_()
    torch.library.opcheck(torch.ops.opbridge.group_norm.default, (x64, 2, w64, b64, 1e-3, act))
    torch.library.opcheck(torch.ops.opbridge.group_norm.default, (x64, 2, None, None, 1e-5, act))
    g = torch.randn_like(x64)
    torch.library.opcheck(torch.ops.opbridge.group_norm_backward.default, (g, x64.detach(), 2, w64, b64, 1e-5, act))


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.gn = opbridge.nn.GroupNorm(4, 16, activation="silu")

    def forward(self, x):
        return self.gn(self.conv(x)) * 2


def test_torch_compile_channels_last_silu(rng):
    import opbridge.nn  # noqa: F401

    model = _Block().to(memory_format=torch.channels_last)
    x = torch.from_numpy(rng.standard_normal((2, 3, 8, 9))).float().contiguous(memory_format=torch.channels_last)
    expected = model(x)
    assert expected.is_contiguous(memory_format=torch.channels_last)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    y = compiled(x)
    torch.testing.assert_close(y, expected)
    assert y.is_contiguous(memory_format=torch.channels_last)
    y.sum().backward()  # the compiled backward (fake kernel of group_norm_backward)
    x2 = torch.from_numpy(rng.standard_normal((5, 3, 8, 9))).float().contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(compiled(x2), model(x2))


def test_torch_export_dynamic_batch_channels_last_silu(rng):
    import opbridge.nn  # noqa: F401

    model = _Block().eval()
    x = torch.from_numpy(rng.standard_normal((2, 3, 8, 9))).float().contiguous(memory_format=torch.channels_last)
    batch = torch.export.Dim("batch")
    ep = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
    assert any(n.target == torch.ops.opbridge.group_norm.default for n in ep.graph.nodes)
    for n in (1, 4):
        xn = torch.from_numpy(rng.standard_normal((n, 3, 8, 9))).float().contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(ep.module()(xn), model(xn))


# ---- errors ------------------------------------------------------------------------------------

_MSG = r"activation must be 'none' or 'silu', got 'relu'"


def test_unknown_activation_is_a_clear_error_everywhere(rng):
    x, w, b = _inputs(rng, (2, 4, 3), torch.float32)
    with pytest.raises(ValueError, match=r"opbridge::group_norm: " + _MSG):
        opbridge.ops.group_norm(x, 2, w, b, activation="relu")
    with pytest.raises(ValueError, match=r"opbridge::group_norm: " + _MSG):  # fake kernel
        opbridge.ops.group_norm(x.to("meta"), 2, activation="relu")
    from helpers.torch_errors import raises_tagged

    # torch.ops on the C++ kernel: the stable ABI's RuntimeError, tagged ValueError.
    # The backward is an op declared of its own (gradient_of group_norm): its messages name it.
    with raises_tagged(ValueError, r"opbridge::group_norm_backward: " + _MSG):
        torch.ops.opbridge.group_norm_backward(x, x, 2, w, b, 1e-5, "relu")
    from opbridge import _core

    with pytest.raises(ValueError, match=_MSG):
        _core.group_norm(x.numpy(), 2, activation="relu")
    with pytest.raises(ValueError, match=r"activation must be 'none' or 'silu', got 'SiLU'"):
        opbridge.nn.GroupNorm(2, 4, activation="SiLU")


# ---- ONNX export -------------------------------------------------------------------------------


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.gn = opbridge.nn.GroupNorm(4, 8, eps=3e-4, activation="silu")
        self.gn2 = opbridge.nn.GroupNorm(2, 8)

    def forward(self, x):
        return self.gn2(self.gn(self.conv(x)))


@pytest.mark.parametrize("lowering", ["custom", "standard"])
@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_export_activation_and_run_in_ort(rng, tmp_path, dynamo, lowering):
    import onnx
    import onnxruntime as ort

    import opbridge.onnx

    model = _Net().eval()
    with torch.no_grad():
        model.gn.weight.uniform_(0.5, 1.5)
        model.gn.bias.uniform_(-1, 1)
    x = torch.from_numpy(rng.standard_normal((2, 3, 6, 7))).float().contiguous(memory_format=torch.channels_last)
    path = tmp_path / "net.onnx"
    proto = opbridge.onnx.export(model, (x,), path, dynamo=dynamo, lowering=lowering)
    nodes = [n for n in proto.graph.node if n.domain == "ai.opbridge"]
    if lowering == "custom":
        assert [n.op_type for n in nodes] == ["GroupNorm", "GroupNorm"]
        attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in nodes]
        # The attribute is written only where it differs from its default.
        assert attrs[0]["activation"] == b"silu" and "activation" not in attrs[1]
        assert not any(n.op_type == "Sigmoid" for n in proto.graph.node)
        sess = opbridge.InferenceSession(str(path))
    else:
        assert not nodes and any(n.op_type == "Sigmoid" for n in proto.graph.node)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # stock ORT
    onnx.checker.check_model(proto, full_check=True)
    for n in (2, 3):
        xn = torch.from_numpy(rng.standard_normal((n, 3, 6, 7))).float()
        y = sess.run(None, {sess.get_inputs()[0].name: xn.numpy()})[0]
        np.testing.assert_allclose(y, model(xn).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_export_rejects_unknown_activation(rng, tmp_path):
    import opbridge.onnx

    class M(torch.nn.Module):
        def forward(self, x):
            return opbridge.ops.group_norm(x, 2, activation="gelu")

    with pytest.raises(Exception, match=r"activation must be 'none' or 'silu', got 'gelu'"):
        opbridge.onnx.export(M(), (torch.randn(2, 4, 3),), tmp_path / "m.onnx")


# ---- opbridge.nn.convert fusion ----------------------------------------------------------------


def test_convert_fuses_groupnorm_silu_in_sequential(rng):
    import copy

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.GroupNorm(4, 8), torch.nn.SiLU(),
                                torch.nn.Conv2d(8, 8, 1), torch.nn.GroupNorm(2, 8), torch.nn.ReLU())
    x = torch.from_numpy(rng.standard_normal((2, 3, 5, 5))).float().contiguous(memory_format=torch.channels_last)
    ref = copy.deepcopy(model)
    keys = set(model.state_dict())
    opbridge.nn.convert(model)
    assert model[1].activation == "silu" and isinstance(model[2], torch.nn.Identity)
    assert model[4].activation == "none" and isinstance(model[5], torch.nn.ReLU)  # not a SiLU: kept
    assert set(model.state_dict()) == keys
    torch.testing.assert_close(model(x), ref(x))
    unfused = opbridge.nn.convert(copy.deepcopy(ref), fuse_activations=False)
    assert unfused[1].activation == "none" and isinstance(unfused[2], torch.nn.SiLU)


def _fused_count(model):
    return sum(1 for m in model.modules() if isinstance(m, opbridge.nn.GroupNorm) and m.activation == "silu")


def _tiny_diffusers_model(kind, attention):
    """(model, inputs): a small random-init diffusers UNet2DModel ("unet"; with attention: one
    attention block down and up, one sample, else two samples) or AutoencoderKL decoder
    ("vae_decoder"), built from torch's current random state."""
    diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed (optional 'models' extra)")
    if kind == "unet":
        down, up = (("DownBlock2D", "AttnDownBlock2D"), ("AttnUpBlock2D", "UpBlock2D")) if attention else \
            (("DownBlock2D", "DownBlock2D"), ("UpBlock2D", "UpBlock2D"))
        model = diffusers.UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
                                      block_out_channels=(32, 64), norm_num_groups=8,
                                      down_block_types=down, up_block_types=up)
        steps = [10] if attention else [10, 500]
        return model, (torch.randn(len(steps), 3, 16, 16), torch.tensor(steps))
    model = diffusers.AutoencoderKL(block_out_channels=(32, 64), norm_num_groups=8, latent_channels=4,
                                    down_block_types=("DownEncoderBlock2D",) * 2,
                                    up_block_types=("UpDecoderBlock2D",) * 2).decoder
    return model, (torch.randn(1, 4, 8, 8),)


@pytest.mark.parametrize("kind", ["unet", "vae_decoder"])
def test_convert_fuses_diffusers_blocks(rng, kind):
    import copy

    torch.manual_seed(int(rng.integers(1 << 31)))
    model, args = _tiny_diffusers_model(kind, attention=False)
    model.eval()
    ref = copy.deepcopy(model)
    keys = set(model.state_dict())
    opbridge.nn.convert(model)
    assert set(model.state_dict()) == keys
    n_resnets = sum(1 for m in model.modules() if type(m).__name__ == "ResnetBlock2D")
    # Two per ResnetBlock2D (norm1, norm2), one for conv_norm_out.
    assert _fused_count(model) == 2 * n_resnets + 1
    with torch.no_grad():
        out = model(*args)
        expected = ref(*args)
        out, expected = (getattr(o, "sample", o) for o in (out, expected))
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        cl = tuple(a.contiguous(memory_format=torch.channels_last) if a.dim() == 4 else a for a in args)
        out_cl = getattr(model(*cl), "sample", None)
        torch.testing.assert_close(out_cl if out_cl is not None else model(*cl), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("kind", ["unet", "vae_decoder"])
def test_converted_diffusers_model_trains_like_the_original(rng, kind, layout):
    # One training step's gradients (every parameter and the input) of a converted model against
    # the original's: the fused GroupNorm + SiLU backward, the moved time-embedding SiLU and the
    # memory-format rule all enter.
    import copy

    torch.manual_seed(int(rng.integers(1 << 31)))
    model, args = _tiny_diffusers_model(kind, attention=True)
    if layout == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        args = (args[0].contiguous(memory_format=torch.channels_last),) + args[1:]
    model.train()
    converted = opbridge.nn.convert(copy.deepcopy(model))
    assert _fused_count(converted) > 0
    grads = []
    for m in (model, converted):
        x = args[0].clone().requires_grad_()
        out = m(x, *args[1:])
        out = getattr(out, "sample", out)
        (out.square().mean() + out.mean()).backward()
        grads.append([x.grad] + [p.grad for p in m.parameters()])
    assert len(grads[0]) == len(grads[1])
    for want, got in zip(*grads):
        assert (want is None) == (got is None)
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5 * max(1.0, float(want.abs().max())))
