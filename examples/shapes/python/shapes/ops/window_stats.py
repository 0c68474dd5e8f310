"""shapes::window_stats in torch: the Python function and the autograd formula."""

from __future__ import annotations

import torch
from opbridge.ops import register_autograd, translate_errors

__all__ = ["window_stats"]


# translate_errors: the kernels' errors reach Python through the stable ABI as RuntimeError tagged
# with their type ("ValueError: shapes::window_stats: ..."); this function raises that type.
@translate_errors
def window_stats(x: torch.Tensor, window: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Per window of `window` consecutive elements of each row of x (N, L), float32/float64: their sum
    and their sum of squares, each (N, L // window). Exports to ONNX as com.example.shapes::WindowStats."""
    return torch.ops.shapes.window_stats.default(x, window)


def _setup_context(ctx, inputs, output):
    x, window = inputs
    ctx.save_for_backward(x)
    ctx.window = window


def _backward(ctx, grad_sum, grad_sumsq):
    # First-order gradients from the C++ backward kernel.
    (x,) = ctx.saved_tensors
    return torch.ops.shapes.window_stats_backward.default(grad_sum, grad_sumsq, x, ctx.window), None


def _differentiable(x, window=2):
    # The op in torch ops: higher-order gradients (double backward) differentiate this.
    w = x[:, : x.shape[1] // window * window].unflatten(1, (-1, window))
    return w.sum(-1), (w * w).sum(-1)


# backward_op: the same first-order gradient as _backward (that of x, argument 0), computed by calling
# window_stats_backward(grad_sum, grad_sumsq, x, window) from a graph built in C++, with no Python in
# the forward or the backward; _backward serves the rest (create_graph=True).
register_autograd("shapes::window_stats", _backward, setup_context=_setup_context, double_backward=_differentiable,
                  backward_op="shapes::window_stats_backward", backward_op_grads=(0,))
