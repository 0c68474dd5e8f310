"""shapes::segment_sum in torch: the Python function and the differentiable form of the backward."""

from __future__ import annotations

from typing import cast

import torch
from opbridge.ops import register_gradient, translate_errors

__all__ = ["segment_sum"]


# translate_errors: the kernels' errors reach Python through the stable ABI as RuntimeError tagged
# with their type ("ValueError: shapes::segment_sum: ..."); this function raises that type.
@translate_errors
def segment_sum(values: torch.Tensor, segment_ids: torch.Tensor, num_segments: int) -> torch.Tensor:
    """y[s] = the sum of the rows values[i] with segment_ids[i] == s: values (N, D) float32/float64,
    segment_ids (N,) int64 -> y (num_segments, D). Exports to ONNX as com.example.shapes::SegmentSum."""
    return cast(torch.Tensor, torch.ops.shapes.segment_sum.default(values, segment_ids, num_segments))


def _backward(grad: torch.Tensor, values: torch.Tensor, segment_ids: torch.Tensor, num_segments: int) -> torch.Tensor:
    # segment_sum_backward in differentiable torch ops, for gradients of any order (create_graph=True);
    # first-order gradients run the C++ backward op itself.
    return grad.index_select(0, segment_ids)


# The autograd formula from the backward op's declaration (gradient_of).
register_gradient("shapes::segment_sum", differentiable=_backward)
