"""opbridge.ops.group_norm: GroupNorm as a torch custom op with fake kernel and autograd."""

from __future__ import annotations

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


@torch.library.register_fake("opbridge::group_norm")
def _group_norm_fake(x, num_groups, weight=None, bias=None, eps=1e-5):
    torch._check(x.dim() >= 2, lambda: f"opbridge::group_norm: x must have rank >= 2 (N, C, *), got rank {x.dim()}")
    torch._check(num_groups > 0, lambda: f"opbridge::group_norm: num_groups must be > 0, got {num_groups}")
    torch._check(
        x.shape[1] % num_groups == 0,
        lambda: f"opbridge::group_norm: num_groups must divide the number of channels C = {x.shape[1]}, "
        f"got num_groups = {num_groups}",
    )
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
