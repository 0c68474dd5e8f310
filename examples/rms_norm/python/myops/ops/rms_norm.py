"""myops::rms_norm in torch: the Python function and the autograd formula."""

from __future__ import annotations

import torch
from opbridge.ops import register_autograd, translate_errors

__all__ = ["rms_norm"]


# translate_errors: the kernels' errors reach Python through the stable ABI as RuntimeError tagged
# with their type ("ValueError: myops::rms_norm: ..."); this function raises that type.
@translate_errors
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """x / sqrt(mean(x**2, -1) + eps) * weight, one weight per channel (the last dimension of x);
    float32/float64. Exports to ONNX as com.example.myops::RmsNorm."""
    return torch.ops.myops.rms_norm.default(x, weight, eps)


def _setup_context(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx, grad):
    # First-order gradients from the C++ backward kernel.
    x, weight = ctx.saved_tensors
    grad_x, grad_weight = torch.ops.myops.rms_norm_backward.default(grad, x, weight, ctx.eps)
    return grad_x, grad_weight, None


def _differentiable(x, weight, eps=1e-5):
    # The op in torch ops: higher-order gradients (double backward) differentiate this.
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


# backward_op: the same first-order gradients as _backward (those of x and weight, arguments 0
# and 1), computed by calling rms_norm_backward(grad, x, weight, eps) from a graph built in C++,
# with no Python in the forward or the backward; _backward serves the rest (create_graph=True).
register_autograd("myops::rms_norm", _backward, setup_context=_setup_context, double_backward=_differentiable,
                  backward_op="myops::rms_norm_backward", backward_op_grads=(0, 1))
