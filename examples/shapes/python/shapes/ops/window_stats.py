"""shapes::window_stats in torch: the Python function and the differentiable form of the backward."""

from __future__ import annotations

from typing import cast

import torch
from opbridge.ops import register_gradient, translate_errors

__all__ = ["window_stats"]


# translate_errors: the kernels' errors reach Python through the stable ABI as RuntimeError tagged
# with their type ("ValueError: shapes::window_stats: ..."); this function raises that type.
@translate_errors
def window_stats(x: torch.Tensor, window: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Per window of `window` consecutive elements of each row of x (N, L), float32/float64: their sum
    and their sum of squares, each (N, L // window). Exports to ONNX as com.example.shapes::WindowStats."""
    return cast("tuple[torch.Tensor, torch.Tensor]", torch.ops.shapes.window_stats.default(x, window))


def _backward(grad_sum: torch.Tensor, grad_sumsq: torch.Tensor, x: torch.Tensor, window: int = 2) -> torch.Tensor:
    # window_stats_backward in differentiable torch ops, for gradients of any order (create_graph=True);
    # first-order gradients run the C++ backward op itself. The left-out tail gets 0.
    used = grad_sum.shape[1] * window
    g = grad_sum.repeat_interleave(window, 1) + 2 * x[:, :used] * grad_sumsq.repeat_interleave(window, 1)
    return torch.nn.functional.pad(g, (0, x.shape[1] - used))


# The autograd formula from the backward op's declaration (gradient_of).
register_gradient("shapes::window_stats", differentiable=_backward)
