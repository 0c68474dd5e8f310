"""shapes::segment_sum in torch: the Python function and the autograd formula."""

from __future__ import annotations

import torch
from opbridge.ops import register_autograd, translate_errors

__all__ = ["segment_sum"]


# translate_errors: the kernels' errors reach Python through the stable ABI as RuntimeError tagged
# with their type ("ValueError: shapes::segment_sum: ..."); this function raises that type.
@translate_errors
def segment_sum(values: torch.Tensor, segment_ids: torch.Tensor, num_segments: int) -> torch.Tensor:
    """y[s] = the sum of the rows values[i] with segment_ids[i] == s: values (N, D) float32/float64,
    segment_ids (N,) int64 -> y (num_segments, D). Exports to ONNX as com.example.shapes::SegmentSum."""
    return torch.ops.shapes.segment_sum.default(values, segment_ids, num_segments)


def _setup_context(ctx, inputs, output):
    values, segment_ids, num_segments = inputs
    ctx.save_for_backward(values, segment_ids)
    ctx.num_segments = num_segments


def _backward(ctx, grad):
    # First-order gradients from the C++ backward kernel; segment_ids and num_segments have none.
    values, segment_ids = ctx.saved_tensors
    grad_values = torch.ops.shapes.segment_sum_backward.default(grad, values, segment_ids, ctx.num_segments)
    return grad_values, None, None


def _differentiable(values, segment_ids, num_segments):
    # The op in torch ops: higher-order gradients (double backward) differentiate this.
    return values.new_zeros(num_segments, values.shape[1]).index_add(0, segment_ids, values)


# backward_op: the same first-order gradient as _backward (that of values, argument 0), computed by
# calling segment_sum_backward(grad, values, segment_ids, num_segments) from a graph built in C++,
# with no Python in the forward or the backward; _backward serves the rest (create_graph=True).
register_autograd("shapes::segment_sum", _backward, setup_context=_setup_context, double_backward=_differentiable,
                  backward_op="shapes::segment_sum_backward", backward_op_grads=(0,))
