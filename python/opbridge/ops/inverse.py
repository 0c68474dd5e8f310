"""opbridge.ops.inverse: matrix inverse as a torch custom op with fake kernel and autograd."""

from __future__ import annotations

from typing import Any, cast

import torch

from ._torch_adapter import register_autograd
from ._errors import raise_translated

__all__ = ["inverse"]


def inverse(x: torch.Tensor, on_singular: str = "raise") -> torch.Tensor:
    """Inverse of each square matrix of ``x`` (shape ``(*, n, n)``, float32 or float64), like
    ``torch.linalg.inv``. Runs opbridge's C++ kernel (correct at any thread count and size), exports to
    ONNX as ``ai.opbridge::Inverse`` (or ``com.microsoft::Inverse`` with
    ``lowering={"inverse": "standard"}``).

    on_singular: what a singular matrix does. ``"raise"`` (default): ``torch.linalg.LinAlgError``
        naming its index in the batch. ``"nan"``: that matrix's inverse is all NaN (and so is its
        gradient), every other matrix is computed as usual -- for batches of independent problems,
        e.g. one Kalman update per track, where one degenerate item must not fail the rest.
    """
    try:
        return cast(torch.Tensor, torch.ops.opbridge.inverse.default(x, on_singular))
    except RuntimeError as e:
        raise_translated(e)
        raise


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(output)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    # d(A^-1) = -A^-1 dA A^-1, so dL/dA = -A^-T G A^-T. Written with torch ops so that it is
    # itself differentiable (double backward, Hessian-vector products).
    # With on_singular="nan" a singular item's y is NaN, and so is its gradient (the batched
    # products keep items apart, so the other items' gradients are unaffected).
    (y,) = ctx.saved_tensors
    yt = y.transpose(-2, -1)
    return -(yt @ grad @ yt), None


register_autograd("opbridge::inverse", _backward, setup_context=_setup_context, double_backward=True)
