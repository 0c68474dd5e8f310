"""opbridge.ops.group_norm: GroupNorm as a torch custom op with fake kernel and autograd."""

from __future__ import annotations

import math
from typing import Optional

import torch

from ._declared import register_autograd

__all__ = ["group_norm"]


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    activation: str = "none",
) -> torch.Tensor:
    """Group normalization with per-channel affine, same semantics as
    ``torch.nn.functional.group_norm``: x is (N, C, *) and C must be divisible by num_groups.
    Runs opbridge's C++ (CPU) or CUDA kernel, exports to ONNX as ``ai.opbridge::GroupNorm``."""
    return torch.ops.opbridge.group_norm.default(x, num_groups, weight, bias, eps, activation)


@torch.library.register_fake("opbridge::group_norm_backward")
def _group_norm_backward_fake(grad, x, num_groups, weight, eps):
    c = x.shape[1]
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        x.new_empty((c,)),
        x.new_empty((c,)),
    )


def _setup_context(ctx, inputs, output):
    x, num_groups, weight, bias, eps, activation = inputs
    ctx.save_for_backward(x, weight)
    ctx.num_groups = num_groups
    ctx.eps = eps
    ctx.has_bias = bias is not None


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    if torch.is_grad_enabled():
        # create_graph: the gradient must itself be differentiable (double backward, Hessian-vector
        # products), which the C++ backward kernel is not; the composite of torch ops is.
        dx, dw, db = _group_norm_backward_composite(grad, x, ctx.num_groups, weight, ctx.eps)
    else:
        dx, dw, db = torch.ops.opbridge.group_norm_backward.default(grad, x, ctx.num_groups, weight, ctx.eps)
    need = ctx.needs_input_grad
    return (
        dx if need[0] else None,
        None,
        dw if weight is not None and need[2] else None,
        db if ctx.has_bias and need[3] else None,
        None,
        None,
    )


register_autograd("opbridge::group_norm", _backward, setup_context=_setup_context, double_backward=True)


def _group_norm_backward_composite(grad, x, num_groups, weight, eps):
    """opbridge::group_norm_backward from torch ops, for devices without an opbridge backward
    kernel (CUDA): same outputs as the C++ CPU kernel (dx, dweight, dbias; dweight/dbias as if
    weight were 1 when it is None). Statistics in float32 (float64 for float64 inputs)."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    n, c = x.shape[0], x.shape[1]
    if x.numel() == 0:
        return torch.zeros_like(x, memory_format=torch.contiguous_format), x.new_zeros((c,)), x.new_zeros((c,))
    xg = x.to(acc).reshape(n, num_groups, -1)
    var, mean = torch.var_mean(xg, dim=2, correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    xhat = ((xg - mean) * rstd).reshape(n, c, -1)
    g = grad.to(acc).reshape(n, c, -1)
    dweight = (g * xhat).sum(dim=(0, 2))
    dbias = g.sum(dim=(0, 2))
    dxhat = g if weight is None else g * weight.to(acc).reshape(1, c, 1)
    dxhat = dxhat.reshape(n, num_groups, -1)
    xhat = xhat.reshape(n, num_groups, -1)
    dx = rstd * (dxhat - dxhat.mean(dim=2, keepdim=True) - xhat * (dxhat * xhat).mean(dim=2, keepdim=True))
    return dx.reshape(x.shape).to(x.dtype).contiguous(), dweight.to(x.dtype), dbias.to(x.dtype)


# The CUDA forward is a C++ kernel; its backward is the composite above unless the extension
# registered a CUDA kernel of its own.
if not torch._C._dispatch_has_kernel_for_dispatch_key("opbridge::group_norm_backward", "CUDA"):
    torch.library.impl("opbridge::group_norm_backward", "cuda", _group_norm_backward_composite)
