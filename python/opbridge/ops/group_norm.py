"""opbridge.ops.group_norm: GroupNorm (with an optional fused SiLU) as a torch custom op with fake
kernel and autograd (first and higher order)."""

from __future__ import annotations

import math
import struct
from typing import Any, Optional, cast

import torch

from .._declarations import AttrDecl
from .._op_library import opbridge_library
from ._torch_adapter import channels_last, register_formula, register_gradient, restricted
from ._errors import raise_translated

__all__ = ["group_norm"]

_DECL = opbridge_library().ops["group_norm"]
# The values of the `activation` argument (and of the ONNX attribute of the same name), and the
# default of `eps`: the declaration's (ops/group_norm/group_norm_decl.cpp).
ACTIVATIONS: tuple[str, ...] = cast(AttrDecl, _DECL.arg("activation")).choices
DEFAULT_EPS: float = cast(AttrDecl, _DECL.arg("eps")).default


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = DEFAULT_EPS,
    activation: str = "none",
) -> torch.Tensor:
    """Group normalization with per-channel affine, same semantics as
    ``torch.nn.functional.group_norm``: x is (N, C, *) and C must be divisible by num_groups.

    ``activation="silu"`` applies SiLU to the result in the same pass
    (``F.silu(F.group_norm(...))``, one read and one write of memory instead of two each).

    The result has x's memory format: a channels-last x (``torch.channels_last``,
    ``channels_last_3d``, or any x whose memory is (N, *spatial, C)) gives a channels-last result
    without copies; other non-contiguous inputs give a contiguous result. Differentiable to any
    order. Runs opbridge's C++ (CPU) or CUDA kernel, exports to ONNX as ``ai.opbridge::GroupNorm``."""
    try:
        return cast(torch.Tensor, torch.ops.opbridge.group_norm.default(x, num_groups, weight, bias, eps, activation))
    except RuntimeError as e:
        raise_translated(e)
        raise


# ---- memory format: the rule of the generic torch kernel (cpp/torch/torch_ops.cpp) ------------


def _channels_last_order(rank: int) -> tuple[int, ...]:
    """(0, 2, ..., rank - 1, 1): x.permute(order) is (N, *spatial, C)."""
    return (0, *range(2, rank), 1)


def _inverse(order: tuple[int, ...]) -> list[int]:
    inv = [0] * len(order)
    for i, o in enumerate(order):
        inv[o] = i
    return inv


def uses_channels_last(x: torch.Tensor) -> bool:
    """Whether opbridge's group_norm processes x as (N, *spatial, C) memory and returns a result of
    that memory format: x's memory is channels-last and x is not also contiguous (where both
    hold, e.g. C = 1, the two layouts coincide and the result is contiguous). The rule of every
    op whose declared output keeps_memory_format()."""
    return channels_last(x)


def _empty_in_layout(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    if not channels_last:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    order = _channels_last_order(x.dim())
    return x.new_empty([x.shape[i] for i in order]).permute(_inverse(order))


def _to_layout(t: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """t with channels-last memory (a copy where it has not) or contiguous; differentiable."""
    if not channels_last:
        return t.contiguous()
    order = _channels_last_order(t.dim())
    return t.permute(order).contiguous().permute(_inverse(order))


# ---- fake kernels: both ops' come from their declarations (ops/_torch_adapter.py) -------------------


# ---- autograd ---------------------------------------------------------------------------------
# First-order gradients are opbridge::group_norm_backward's (declared as group_norm's gradient,
# ops/group_norm/group_norm_decl.cpp); where they must be differentiable (create_graph=True)
# they are computed by the composite of torch ops below, which autograd differentiates again.

def _backward_of_backward(ctx: Any, *grads: Any) -> Any:
    raise RuntimeError(
        "opbridge::group_norm_backward has no derivative: differentiate opbridge::group_norm itself "
        "(torch.autograd.grad(..., create_graph=True) through it gives correct higher-order gradients)"
    )


register_formula("opbridge::group_norm_backward", _backward_of_backward, lambda ctx, inputs, output: None)


def _float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (+-inf past its range), as the kernels take it."""
    try:
        return float(struct.unpack("f", struct.pack("f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


def _group_norm_backward_composite(grad: torch.Tensor, x: torch.Tensor, num_groups: int, weight: torch.Tensor | None,
                                   bias: torch.Tensor | None, eps: float, activation: str = "none"
                                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """opbridge::group_norm_backward from torch ops: the differentiable backward (used under
    create_graph=True) and the backward on devices without an opbridge backward kernel (CUDA).
    Same outputs as the C++ CPU kernel (dx in x's memory format, dweight, dbias; dweight/dbias as
    if weight were 1 when it is None). Statistics in float32 (float64 for float64 inputs)."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    eps = _float32(eps)  # the forward kernels compute with float32(eps): float attributes are float32
    n, c = x.shape[0], x.shape[1]
    cl = uses_channels_last(x)
    if x.numel() == 0:
        return _empty_in_layout(x, cl).zero_(), x.new_zeros((c,)), x.new_zeros((c,))
    xg = x.to(acc).reshape(n, num_groups, -1)
    var, mean = torch.var_mean(xg, dim=2, correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    xhat = ((xg - mean) * rstd).reshape(n, c, -1)
    g = grad.to(acc).reshape(n, c, -1)
    w = None if weight is None else weight.to(acc).reshape(1, c, 1)
    if activation == "silu":
        z = xhat if w is None else xhat * w
        if bias is not None:
            z = z + bias.to(acc).reshape(1, c, 1)
        s = torch.sigmoid(z)
        g = g * (s * (1 + z * (1 - s)))
    dweight = (g * xhat).sum(dim=(0, 2))
    dbias = g.sum(dim=(0, 2))
    dxhat = g if w is None else g * w
    dxhat = dxhat.reshape(n, num_groups, -1)
    xhat = xhat.reshape(n, num_groups, -1)
    dx = rstd * (dxhat - dxhat.mean(dim=2, keepdim=True) - xhat * (dxhat * xhat).mean(dim=2, keepdim=True))
    dx = _to_layout(dx.reshape(x.shape).to(x.dtype), cl)
    return dx, dweight.to(x.dtype), dbias.to(x.dtype)


register_gradient("opbridge::group_norm", differentiable=_group_norm_backward_composite)

# The CUDA forward is a C++ kernel; its backward is the composite above unless the extension
# registered a CUDA kernel of its own.
if not torch._C._dispatch_has_kernel_for_dispatch_key("opbridge::group_norm_backward", "CUDA"):
    torch.library.impl("opbridge::group_norm_backward", "cuda",
                       restricted(_group_norm_backward_composite, opbridge_library().ops["group_norm_backward"],
                                  "its CUDA form (a composite of torch ops)"))
