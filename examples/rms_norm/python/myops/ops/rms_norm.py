"""myops::rms_norm in torch: the Python function and the autograd formula."""

from __future__ import annotations

import torch
from opbridge.ops import register_autograd

__all__ = ["rms_norm"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """y = alpha * x * weight, one weight per channel (the last dimension of x); float32/float64.
    Exports to ONNX as com.example.myops::RmsNorm."""
    return torch.ops.myops.rms_norm.default(x, weight, alpha)


def _setup_context(ctx, inputs, output):
    x, weight, alpha = inputs
    ctx.save_for_backward(x, weight)
    ctx.alpha = alpha


def _backward(ctx, grad):
    # First-order gradients from the C++ backward kernel.
    x, weight = ctx.saved_tensors
    grad_x, grad_weight = torch.ops.myops.rms_norm_backward.default(grad, x, weight, ctx.alpha)
    return grad_x, grad_weight, None


def _differentiable(x, weight, alpha=1.0):
    # The op in torch ops: higher-order gradients (double backward) differentiate this.
    return alpha * x * weight


register_autograd("myops::rms_norm", _backward, setup_context=_setup_context, double_backward=_differentiable)
