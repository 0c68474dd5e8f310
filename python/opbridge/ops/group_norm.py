"""opbridge.ops.group_norm: GroupNorm as a torch custom op with fake kernel and autograd."""

from __future__ import annotations

import math
from typing import Optional

import torch

__all__ = ["group_norm"]


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Group normalization with per-channel affine, same semantics as
    ``torch.nn.functional.group_norm``: x is (N, C, *) and C must be divisible by num_groups.
    Runs opbridge's C++ (CPU) or CUDA kernel, exports to ONNX as ``ai.opbridge::GroupNorm``."""
    return torch.ops.opbridge.group_norm.default(x, num_groups, weight, bias, eps)


_OP = "opbridge::group_norm"


def _check_param(p, x, name):
    # The fake kernel also serves the Meta dispatch key, which wins over CPU when any argument
    # is a meta tensor: without these checks a CPU x with a meta weight would return an
    # uninitialized tensor instead of an error.
    if p is None:
        return
    torch._check_type(p.dtype == x.dtype, lambda: f"{_OP}: {name} must have the dtype of x ({x.dtype}), got {p.dtype}")
    torch._check_value(p.device == x.device,
                       lambda: f"{_OP}: {name} must be on x's device ({x.device}), got {p.device}")
    torch._check_value(p.dim() == 1,
                       lambda: f"{_OP}: {name} must be 1-D (one value per channel), got shape {list(p.shape)}")
    torch._check_value(p.shape[0] == x.shape[1], lambda: f"{_OP}: {name} must have C = {x.shape[1]} elements "
                       f"(one per channel), got {p.shape[0]}")


@torch.library.register_fake("opbridge::group_norm")
def _group_norm_fake(x, num_groups, weight=None, bias=None, eps=1e-5):
    torch._check_type(x.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16),
                      lambda: f"{_OP}: x must be a floating tensor (float32, float64, float16 or bfloat16), "
                      f"got {x.dtype}")
    torch._check_value(x.dim() >= 2, lambda: f"{_OP}: x must have rank >= 2 (N, C, *), got rank {x.dim()}")
    torch._check_value(num_groups > 0, lambda: f"{_OP}: num_groups must be > 0, got {num_groups}")
    torch._check_value(
        x.shape[1] % num_groups == 0,
        lambda: f"{_OP}: num_groups must divide the number of channels C = {x.shape[1]}, "
        f"got num_groups = {num_groups}",
    )
    _check_param(weight, x, "weight")
    _check_param(bias, x, "bias")
    torch._check_value(math.isfinite(eps) and eps >= 0, lambda: f"{_OP}: eps must be finite and >= 0, got {eps}")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("opbridge::group_norm_backward")
def _group_norm_backward_fake(grad, x, num_groups, weight, eps):
    c = x.shape[1]
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        x.new_empty((c,)),
        x.new_empty((c,)),
    )


def _setup_context(ctx, inputs, output):
    x, num_groups, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.num_groups = num_groups
    ctx.eps = eps
    ctx.has_bias = bias is not None


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    dx, dw, db = torch.ops.opbridge.group_norm_backward.default(grad, x, ctx.num_groups, weight, ctx.eps)
    need = ctx.needs_input_grad
    return (
        dx if need[0] else None,
        None,
        dw if weight is not None and need[2] else None,
        db if ctx.has_bias and need[3] else None,
        None,
    )


torch.library.register_autograd("opbridge::group_norm", _backward, setup_context=_setup_context)


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
