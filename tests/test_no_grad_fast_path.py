"""Calls that need no gradient skip the Python autograd kernel (opbridge::_no_grad_fast_path).

torch.library.register_autograd makes every call of the op enter a Python kernel, gradient or
not. opbridge.ops.register_autograd adds a C++ kernel in front that goes straight to the op's
kernels when grad mode is off or no tensor argument requires grad, and to the Python formula
otherwise. Checked here: which path each call takes (by watching for torch's Python autograd
kernel), that both give the same result, and that gradients still flow, also through a tensor
list argument of an op of the user's.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from msda_inputs import make_inputs

torch = pytest.importorskip("torch")
import opbridge.ops  # noqa: E402
from opbridge.ops import register_autograd  # noqa: E402

pytestmark = pytest.mark.torch


def python_autograd_calls(fn):
    """fn()'s result and how many times torch's Python autograd kernel of a registered formula
    (torch/_library/autograd.py: autograd_impl) ran during it."""
    calls = []

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_name == "autograd_impl" and code.co_filename.endswith("autograd.py"):
            calls.append(code.co_filename)

    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        out = fn()
    finally:
        sys.setprofile(old)
    return out, len(calls)


def op_cases(rng):
    """(name, fn(requires_grad) -> output of one call) for each op of the library."""
    x = rng.standard_normal((2, 8, 5, 3))
    w, b = rng.standard_normal(8), rng.standard_normal(8)
    a = rng.standard_normal((3, 4, 4)) + 4 * np.eye(4)
    value, shapes, starts, loc, aw = make_inputs(rng, [(3, 4), (2, 2)], 2, 2, 4, 5, 2)
    g = rng.standard_normal((2, 5, 8))

    def t(v, rg=False):
        return torch.tensor(v, dtype=torch.float64, requires_grad=rg)

    return [
        ("group_norm", lambda rg: torch.ops.opbridge.group_norm(t(x, rg), 4, t(w), t(b), 1e-5, "silu")),
        ("inverse", lambda rg: torch.ops.opbridge.inverse(t(a, rg))),
        ("ms_deform_attn", lambda rg: torch.ops.opbridge.ms_deform_attn(
            t(value, rg), torch.tensor(shapes), torch.tensor(starts), t(loc), t(aw))),
        ("ms_deform_attn_backward", lambda rg: torch.ops.opbridge.ms_deform_attn_backward(
            t(g, rg), t(value), torch.tensor(shapes), torch.tensor(starts), t(loc), t(aw))[0]),
        ("group_norm_backward", lambda rg: torch.ops.opbridge.group_norm_backward(
            t(x, rg), t(x), 4, t(w), t(b), 1e-5, "none")[0]),
    ]


@pytest.mark.parametrize("index", range(5))
def test_only_calls_that_need_gradients_run_python(index):
    rng = np.random.default_rng()
    name, call = op_cases(rng)[index]
    plain, n_plain = python_autograd_calls(lambda: call(False))
    assert n_plain == 0, f"{name}: no input requires grad, yet the Python autograd kernel ran"
    with torch.no_grad():
        off, n_off = python_autograd_calls(lambda: call(True))
    assert n_off == 0, f"{name}: grad mode is off, yet the Python autograd kernel ran"
    assert off.grad_fn is None and not off.requires_grad
    graded, n_graded = python_autograd_calls(lambda: call(True))
    assert n_graded == 1, f"{name}: an input requires grad; the formula must run once, ran {n_graded} times"
    assert graded.grad_fn is not None
    # Same kernels either way: bit-identical results.
    assert torch.equal(plain, off)
    assert torch.equal(plain, graded.detach())


def test_gradients_through_the_fast_path_match_the_reference():
    # The C++ kernel hands calls that need gradients to the formula: first and second order
    # gradients of GroupNorm + SiLU, against finite differences in float64.
    rng = np.random.default_rng()
    x = torch.tensor(rng.standard_normal((2, 6, 4, 3)), requires_grad=True)
    w = torch.tensor(rng.standard_normal(6), requires_grad=True)
    b = torch.tensor(rng.standard_normal(6), requires_grad=True)
    f = lambda x, w, b: torch.ops.opbridge.group_norm(x, 3, w, b, 1e-5, "silu")  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, w, b))
    assert torch.autograd.gradgradcheck(f, (x, w, b))


def test_a_user_op_with_a_tensor_list_gets_the_fast_path():
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
    rng = np.random.default_rng()
    a, b = (torch.tensor(rng.standard_normal(5)) for _ in range(2))
    out, n = python_autograd_calls(lambda: torch.ops.opbridge_fastpath_test.weighted_sum([a, b], 2.5))
    assert n == 0
    np.testing.assert_allclose(out.numpy(), 2.5 * (a.numpy() + b.numpy()), rtol=1e-15)
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
    # to the CUDA kernels; with it, through the formula (gradients against the CPU op's).
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
    assert n == 1
    (g,) = torch.autograd.grad(out.sum(), [xg])
    xr = x.clone().requires_grad_()
    (gr,) = torch.autograd.grad(torch.ops.opbridge.group_norm(xr, 4, w, None, 1e-5, "silu").sum(), [xr])
    torch.testing.assert_close(g.cpu(), gr, rtol=1e-4, atol=1e-4)
