"""opbridge.ops.inverse: matrix inverse as a torch custom op with fake kernel and autograd."""

from __future__ import annotations

import torch

from ._declared import register_autograd

__all__ = ["inverse"]


def inverse(x: torch.Tensor, on_singular: str = "raise") -> torch.Tensor:
    """Inverse of each square matrix of ``x`` (shape ``(*, n, n)``, float32 or float64), like
    ``torch.linalg.inv``; a singular matrix raises ``torch.linalg.LinAlgError`` naming its index
    in the batch. Runs opbridge's C++ kernel (correct at any thread count and size), exports to
    ONNX as ``ai.opbridge::Inverse`` (or ``com.microsoft::Inverse`` with
    ``lowering={"inverse": "standard"}``)."""
    return torch.ops.opbridge.inverse.default(x, on_singular)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


def _backward(ctx, grad):
    # d(A^-1) = -A^-1 dA A^-1, so dL/dA = -A^-T G A^-T. Written with torch ops so that it is
    # itself differentiable (double backward, Hessian-vector products).
    (y,) = ctx.saved_tensors
    yt = y.transpose(-2, -1)
    return -(yt @ grad @ yt), None


register_autograd("opbridge::inverse", _backward, setup_context=_setup_context, double_backward=True)
