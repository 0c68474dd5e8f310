"""index_ops::segment_max in torch: the Python function and the differentiable form of the backward."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor
from opbridge.ops import register_gradient, translate_errors

__all__ = ["segment_max"]


# translate_errors: the kernels' errors reach Python through the stable ABI as RuntimeError tagged
# with their type ("ValueError: index_ops::segment_max: ..."); this function raises that type.
@translate_errors
def segment_max(values: Tensor, segment_ids: Tensor, num_segments: int) -> tuple[Tensor, Tensor]:
    """Per segment and column, the largest row of values (N, D) float32/float64 among those whose
    segment_ids (N,) int64 name it: (y, argmax), both (num_segments, D); y is 0 and argmax -1 for an
    empty segment. argmax has no gradient. Exports to ONNX as com.example.index_ops::SegmentMax."""
    return cast("tuple[Tensor, Tensor]", torch.ops.index_ops.segment_max.default(values, segment_ids, num_segments))


def _backward(grad: Tensor, argmax: Tensor, values: Tensor, segment_ids: Tensor, num_segments: int) -> Tensor:
    # segment_max_backward in differentiable torch ops, for gradients of any order (create_graph=True);
    # first-order gradients run the C++ backward op itself, with the argmax the forward saved.
    return torch.zeros_like(values).scatter_add(0, argmax.clamp(min=0), torch.where(argmax >= 0, grad, 0))


# The autograd formula from the backward op's declaration (gradient_of).
register_gradient("index_ops::segment_max", differentiable=_backward)
