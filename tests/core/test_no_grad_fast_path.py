"""The C++ autograd kernel opbridge puts in front of Python formulas (cpp/torch/autograd_kernel_torch.cpp).

It lives in the optional fast-path library, which uses libtorch's C++ API and so loads only into
the torch release opbridge was built with: in any other torch (the stable-ABI extension itself
loads into every torch from 2.11 on) these tests skip, and every call takes the Python formulas.

torch.library.register_autograd makes every call of the op enter a Python kernel, gradient or
not. opbridge.ops.register_autograd adds a C++ kernel in front that goes straight to the op's
kernels when grad mode is off or no tensor argument requires grad; where the op has a backward
op (register_autograd(backward_op=...)), it builds the autograd graph in C++ too, with no Python
in the forward or the backward; otherwise it hands the call to the Python formula. Checked here:
which path each call takes (by watching for torch's Python autograd kernel and the formulas),
that all give the same results, that first and higher-order gradients are right, also for an op
of the user's, and clear errors.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from helpers.msda_inputs import make_inputs

torch = pytest.importorskip("torch")
import opbridge.ops  # noqa: E402
from opbridge.ops import register_autograd  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(not hasattr(torch.ops.opbridge, "_no_grad_fast_path"),
                       reason=f"the fast-path library goes with the torch opbridge was built with "
                              f"({opbridge.build_info().get('torch_version')}), not torch {torch.__version__}"),
]


def python_frames(fn, keep):
    """fn()'s result and the names of the Python functions entered during it whose code object
    `keep` accepts."""
    names = []

    def profile(frame, event, arg):
        if event == "call" and keep(frame.f_code):
            names.append(frame.f_code.co_name)

    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        out = fn()
    finally:
        sys.setprofile(old)
    return out, names


def python_autograd_calls(fn):
    """fn()'s result and how many times torch's Python autograd kernel of a registered formula
    (torch/_library/autograd.py: autograd_impl) ran during it."""
    out, names = python_frames(
        fn, lambda code: code.co_name == "autograd_impl" and code.co_filename.endswith("autograd.py"))
    return out, len(names)


def python_formula_frames(fn):
    """fn()'s result and the Python functions entered during it that belong to an autograd
    formula: torch.library's generated autograd.Function (torch/_library/autograd.py) or
    opbridge's own formulas (opbridge/ops/*.py)."""

    def keep(code):
        f = code.co_filename.replace("\\", "/")
        return f.endswith("torch/_library/autograd.py") or "/opbridge/ops/" in f

    return python_frames(fn, keep)


def op_cases(rng):
    """(name, fn(requires_grad) -> output of one call) for each op of the library."""
    x = rng.standard_normal((2, 8, 5, 3))
    w, b = rng.standard_normal(8), rng.standard_normal(8)
    a = rng.standard_normal((3, 4, 4)) + 4 * np.eye(4)
    value, shapes, starts, loc, aw = make_inputs(rng, [(3, 4), (2, 2)], 2, 2, 4, 5, 2)
    g = rng.standard_normal((2, 5, 8))

    def t(v, rg=False):
        return torch.tensor(v, dtype=torch.float64, requires_grad=rg)

    # (name, call, whether the op has a backward op: its graph is then built in C++)
    return [
        ("group_norm", lambda rg: torch.ops.opbridge.group_norm(t(x, rg), 4, t(w), t(b), 1e-5, "silu"), True),
        ("inverse", lambda rg: torch.ops.opbridge.inverse(t(a, rg)), False),
        ("ms_deform_attn", lambda rg: torch.ops.opbridge.ms_deform_attn(
            t(value, rg), torch.tensor(shapes), torch.tensor(starts), t(loc), t(aw)), True),
        ("ms_deform_attn_backward", lambda rg: torch.ops.opbridge.ms_deform_attn_backward(
            t(g, rg), t(value), torch.tensor(shapes), torch.tensor(starts), t(loc), t(aw))[0], False),
        ("group_norm_backward", lambda rg: torch.ops.opbridge.group_norm_backward(
            t(x, rg), t(x), 4, t(w), t(b), 1e-5, "none")[0], False),
    ]


@pytest.mark.parametrize("index", range(5))
def test_only_calls_that_need_gradients_run_python(index):
    rng = np.random.default_rng()
    name, call, cpp_graph = op_cases(rng)[index]
    plain, n_plain = python_autograd_calls(lambda: call(False))
    assert n_plain == 0, f"{name}: no input requires grad, yet the Python autograd kernel ran"
    with torch.no_grad():
        off, n_off = python_autograd_calls(lambda: call(True))
    assert n_off == 0, f"{name}: grad mode is off, yet the Python autograd kernel ran"
    assert off.grad_fn is None and not off.requires_grad
    graded, n_graded = python_autograd_calls(lambda: call(True))
    if cpp_graph:
        assert n_graded == 0, f"{name}: has a backward op, yet the Python autograd kernel ran"
        assert type(graded.grad_fn).__name__ == "CppFunction" and graded.grad_fn.name() == f"OpbridgeBackward[opbridge::{name}]"
    else:
        assert n_graded == 1, f"{name}: an input requires grad; the formula must run once, ran {n_graded} times"
    assert graded.grad_fn is not None
    # Same kernels either way: bit-identical results.
    assert torch.equal(plain, off)
    assert torch.equal(plain, graded.detach())


def test_gradients_through_the_fast_path_match_the_reference():
    # First order through the C++ graph (the backward op), second order through the node's
    # recomputation with the Python formula: GroupNorm + SiLU against finite differences, float64.
    rng = np.random.default_rng()
    x = torch.tensor(rng.standard_normal((2, 6, 4, 3)), requires_grad=True)
    w = torch.tensor(rng.standard_normal(6), requires_grad=True)
    b = torch.tensor(rng.standard_normal(6), requires_grad=True)
    f = lambda x, w, b: torch.ops.opbridge.group_norm(x, 3, w, b, 1e-5, "silu")  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, w, b))
    assert torch.autograd.gradgradcheck(f, (x, w, b))


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_cpp_graph_gives_the_backward_ops_gradients_without_python(layout):
    # Forward and backward of GroupNorm with weight requiring grad and bias not: no formula code
    # runs in either pass, and the gradients are bit for bit what the backward op returns.
    rng = np.random.default_rng()
    x0 = torch.tensor(rng.standard_normal((2, 8, 5, 6)), dtype=torch.float32)
    if layout == "channels_last":
        x0 = x0.contiguous(memory_format=torch.channels_last)
    x = x0.clone().requires_grad_()
    w = torch.tensor(rng.uniform(0.5, 2, 8), dtype=torch.float32, requires_grad=True)
    b = torch.tensor(rng.standard_normal(8), dtype=torch.float32)
    grad = torch.tensor(rng.standard_normal((2, 8, 5, 6)), dtype=torch.float32)
    y, names = python_formula_frames(lambda: torch.ops.opbridge.group_norm(x, 4, w, b, 1e-5, "silu"))
    assert names == []
    got, names = python_formula_frames(lambda: torch.autograd.grad(y, [x, w], grad, retain_graph=True))
    assert names == []
    with torch.no_grad():
        dx, dw, _ = torch.ops.opbridge.group_norm_backward(grad, x0, 4, w, b, 1e-5, "silu")
    assert torch.equal(got[0], dx) and torch.equal(got[1], dw)
    assert got[0].stride() == dx.stride()
    # b does not require grad: no gradient is made for it, and y.backward leaves it alone.
    y.backward(grad)
    assert b.grad is None and torch.equal(x.grad, dx)


def test_cpp_graph_second_order_follows_the_formula(rng=None):
    # create_graph=True through the C++ node recomputes the op through its formula: GroupNorm's
    # (differentiable) gives gradients of gradients; MultiScaleDeformableAttention's (first order
    # only) keeps its clear error.
    rng = np.random.default_rng()
    x = torch.tensor(rng.standard_normal((2, 4, 3, 3)), requires_grad=True)
    w = torch.tensor(rng.standard_normal(4), requires_grad=True)
    y = torch.ops.opbridge.group_norm(x, 2, w, None, 1e-5, "none")
    assert y.grad_fn.name() == "OpbridgeBackward[opbridge::group_norm]"
    (gx,) = torch.autograd.grad((y * y).sum(), [x], create_graph=True)
    (ggw,) = torch.autograd.grad(gx.square().sum(), [w])
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    yr = torch.nn.functional.group_norm(xr, 2, wr, None, 1e-5)
    (gxr,) = torch.autograd.grad((yr * yr).sum(), [xr], create_graph=True)
    (ggwr,) = torch.autograd.grad(gxr.square().sum(), [wr])
    torch.testing.assert_close(gx, gxr, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ggw, ggwr, rtol=1e-8, atol=1e-8)
    value, shapes, starts, loc, aw = make_inputs(rng, [(3, 4), (2, 2)], 2, 2, 4, 5, 2)
    v = torch.tensor(value, requires_grad=True)
    out = torch.ops.opbridge.ms_deform_attn(v, torch.tensor(shapes), torch.tensor(starts), torch.tensor(loc),
                                            torch.tensor(aw))
    (gv,) = torch.autograd.grad(out.square().sum(), [v], create_graph=True)
    with pytest.raises(NotImplementedError, match="second-order gradients"):
        torch.autograd.grad(gv.sum(), [v])


def test_cpp_graph_detects_inputs_modified_in_place():
    x = torch.randn(2, 4, 3, requires_grad=True)
    h = x * 1.0
    y = torch.ops.opbridge.group_norm(h, 2, None, None, 1e-5, "none")
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_forward_mode_ad_is_a_clear_error():
    # A dual tensor's tangent would be dropped silently (torch.library's own kernel lets it be).
    import torch.autograd.forward_ad as fwAD

    x = torch.randn(2, 4, 3, dtype=torch.float64)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.randn_like(x))
        with pytest.raises(NotImplementedError, match="opbridge::group_norm: forward-mode AD is not implemented"):
            torch.ops.opbridge.group_norm(dual, 2, None, None, 1e-5, "none")
        with pytest.raises(NotImplementedError, match="opbridge::inverse: forward-mode AD is not implemented"):
            torch.ops.opbridge.inverse(fwAD.make_dual(torch.eye(3, dtype=torch.float64), torch.eye(3, dtype=torch.float64)))


def test_a_user_op_with_a_backward_op_gets_the_cpp_graph():
    # An op of the user's (defined in Python) whose first-order gradients another op computes:
    # the graph is built in C++ (the formula is not called in the first order) and gradients of
    # every order are right.
    @torch.library.custom_op("opbridge_fastpath_test::scaled_tanh", mutates_args=())
    def scaled_tanh(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * w

    @scaled_tanh.register_fake
    def _(x, w):
        return torch.empty_like(x)

    @torch.library.custom_op("opbridge_fastpath_test::scaled_tanh_backward", mutates_args=())
    def scaled_tanh_backward(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.tanh(x)
        return grad * w * (1 - t * t), (grad * t).sum(0)

    @scaled_tanh_backward.register_fake
    def _(grad, x, w):
        return torch.empty_like(x), torch.empty_like(w)

    formula_calls = []

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grad):
        formula_calls.append(1)
        x, w = ctx.saved_tensors
        t = torch.tanh(x)
        return grad * w * (1 - t * t), (grad * t).sum(0)

    register_autograd("opbridge_fastpath_test::scaled_tanh", backward, setup_context=setup, double_backward=True,
                      backward_op="opbridge_fastpath_test::scaled_tanh_backward", backward_op_grads=(0, 1))
    rng = np.random.default_rng()
    x = torch.tensor(rng.standard_normal((5, 3)), requires_grad=True)
    w = torch.tensor(rng.standard_normal(3), requires_grad=True)
    f = torch.ops.opbridge_fastpath_test.scaled_tanh
    y = f(x, w)
    assert y.grad_fn.name() == "OpbridgeBackward[opbridge_fastpath_test::scaled_tanh]"
    gx, gw = torch.autograd.grad(y.sum(), [x, w])
    assert formula_calls == []
    t = np.tanh(x.detach().numpy())
    np.testing.assert_allclose(gx.numpy(), w.detach().numpy() * (1 - t * t), rtol=1e-12)
    np.testing.assert_allclose(gw.numpy(), t.sum(0), rtol=1e-12)
    assert torch.autograd.gradcheck(f, (x, w))
    assert torch.autograd.gradgradcheck(f, (x, w))


def test_bad_backward_op_registrations_are_clear_errors():
    with pytest.raises(ValueError, match="grads must be indices of opbridge::group_norm's Tensor arguments, got 1"):
        torch.ops.opbridge._cpp_autograd("opbridge::group_norm", "opbridge::group_norm_backward", [0, 1, 3])
    with pytest.raises(ValueError, match="backward must take the gradients of opbridge::group_norm's 1 outputs"):
        torch.ops.opbridge._cpp_autograd("opbridge::group_norm", "opbridge::inverse", [0, 2, 3])
    with pytest.raises(ValueError, match="returns 3 values; grads names 2 arguments"):
        torch.ops.opbridge._cpp_autograd("opbridge::group_norm", "opbridge::group_norm_backward", [0, 2])
    with pytest.raises(ValueError, match="qualname must name a defined op, got 'opbridge::nope'"):
        torch.ops.opbridge._cpp_autograd("opbridge::group_norm", "opbridge::nope", [0])
    with pytest.raises(TypeError, match="backward_op needs backward_op_grads"):
        register_autograd("opbridge::inverse", lambda ctx, g: g, setup_context=lambda ctx, i, o: None,
                          double_backward=True, backward_op="opbridge::inverse")


def test_a_user_op_with_a_tensor_list_gets_the_fast_path(rng):
    # An op of the user's, defined in Python with a Tensor[] argument: the gradient of a list
    # element that requires grad must still flow (the C++ kernel looks inside lists).
    @torch.library.custom_op("opbridge_fastpath_test::weighted_sum", mutates_args=())
    def weighted_sum(xs: list[torch.Tensor], scale: float) -> torch.Tensor:
        return sum(x * scale for x in xs)

    @weighted_sum.register_fake
    def _(xs, scale):
        return torch.empty_like(xs[0])

    def setup(ctx, inputs, output):
        ctx.n, ctx.scale = len(inputs[0]), inputs[1]

    def backward(ctx, grad):
        return [grad * ctx.scale] * ctx.n, None

    register_autograd("opbridge_fastpath_test::weighted_sum", backward, setup_context=setup, double_backward=True)
    a, b = (torch.tensor(rng.standard_normal(5)) for _ in range(2))
    out, n = python_autograd_calls(lambda: torch.ops.opbridge_fastpath_test.weighted_sum([a, b], 2.5))
    assert n == 0
    # The op's own order of operations (a * 2.5 + b * 2.5): 2.5 * (a + b) rounds differently, by
    # more than rtol 1e-15 where a + b nearly cancels.
    np.testing.assert_allclose(out.numpy(), a.numpy() * 2.5 + b.numpy() * 2.5, rtol=1e-15)
    b.requires_grad_()
    out, n = python_autograd_calls(lambda: torch.ops.opbridge_fastpath_test.weighted_sum([a, b], 2.5))
    assert n == 1
    (gb,) = torch.autograd.grad(out, [b], torch.ones(5, dtype=torch.float64))
    np.testing.assert_allclose(gb.numpy(), np.full(5, 2.5))


def test_bad_qualname_is_a_clear_error():
    with pytest.raises(ValueError, match="qualname must name a defined op, got 'opbridge::no_such_op'"):
        torch.ops.opbridge._no_grad_fast_path("opbridge::no_such_op")
    with pytest.raises(ValueError, match="qualname must be 'namespace::op', got 'group_norm'"):
        torch.ops.opbridge._no_grad_fast_path("group_norm")


@pytest.mark.cuda
def test_cuda_calls_take_the_same_paths():
    # The kernel is installed for AutogradCUDA too: CUDA tensors without requires_grad go straight
    # to the CUDA kernels; with it, through the C++ graph (gradients against the CPU op's).
    rng = np.random.default_rng()
    x = torch.tensor(rng.standard_normal((2, 8, 5, 3)), dtype=torch.float32)
    w = torch.tensor(rng.standard_normal(8), dtype=torch.float32)
    xc, wc = x.cuda(), w.cuda()
    out, n = python_autograd_calls(lambda: torch.ops.opbridge.group_norm(xc, 4, wc, None, 1e-5, "silu"))
    assert n == 0
    torch.testing.assert_close(out.cpu(), torch.ops.opbridge.group_norm(x, 4, w, None, 1e-5, "silu"),
                               rtol=1e-5, atol=1e-5)
    xg = xc.clone().requires_grad_()
    out, n = python_autograd_calls(lambda: torch.ops.opbridge.group_norm(xg, 4, wc, None, 1e-5, "silu"))
    assert n == 0 and out.grad_fn.name() == "OpbridgeBackward[opbridge::group_norm]"
    (g,) = torch.autograd.grad(out.sum(), [xg])
    xr = x.clone().requires_grad_()
    (gr,) = torch.autograd.grad(torch.ops.opbridge.group_norm(xr, 4, w, None, 1e-5, "silu").sum(), [xr])
    torch.testing.assert_close(g.cpu(), gr, rtol=1e-4, atol=1e-4)
