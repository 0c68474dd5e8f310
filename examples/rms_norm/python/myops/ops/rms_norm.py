"""myops::rms_norm in torch: the Python function and the differentiable form of the backward."""

from __future__ import annotations

from typing import cast

import torch
from opbridge.ops import register_gradient, translate_errors

__all__ = ["rms_norm"]


# translate_errors: the kernels' errors reach Python through the stable ABI as RuntimeError tagged
# with their type ("ValueError: myops::rms_norm: ..."); this function raises that type.
@translate_errors
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """x / sqrt(mean(x**2, -1) + eps) * weight, one weight per channel (the last dimension of x);
    float32/float64. Exports to ONNX as com.example.myops::RmsNorm."""
    return cast(torch.Tensor, torch.ops.myops.rms_norm.default(x, weight, eps))


def _backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
              eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    # rms_norm_backward in differentiable torch ops, for gradients of any order (create_graph=True);
    # first-order gradients run the C++ backward op itself.
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    g = grad * weight
    grad_x = r * g - x * r.pow(3) * (g * x).mean(-1, keepdim=True)
    return grad_x, (grad * x * r).reshape(-1, x.shape[-1]).sum(0)


# The autograd formula from the backward op's declaration (gradient_of).
register_gradient("myops::rms_norm", differentiable=_backward)
