"""opbridge.ops.ms_deform_attn: multi-scale deformable attention (Deformable DETR) as a torch
custom op with fake kernels and autograd."""

from __future__ import annotations

from typing import cast

import torch

from ._errors import raise_translated

__all__ = ["ms_deform_attn"]

_LOW = (torch.float16, torch.bfloat16)


def ms_deform_attn(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> torch.Tensor:
    """Multi-scale deformable attention, the semantics of Deformable-DETR's
    ``ms_deform_attn_core_pytorch`` / ``MSDeformAttnFunction`` and transformers'
    ``MultiScaleDeformableAttention``:

    value (N, S, M, D) with S = sum of H_l * W_l; spatial_shapes (L, 2) int64 rows (H_l, W_l);
    level_start_index (L,) int64; sampling_locations (N, Lq, M, L, P, 2) as (x, y) in [0, 1];
    attention_weights (N, Lq, M, L, P). Returns (N, Lq, M * D): for each query and head the sum
    over levels and points of attention weight times the bilinearly sampled value (grid_sample
    with align_corners=False and zero padding). A sample outside its map, or at a NaN/inf
    location, contributes 0 (see docs/ms_deform_attn.md).

    value, sampling_locations and attention_weights share one dtype (float32, float64, float16,
    bfloat16), except that a float16/bfloat16 value with float32 locations and weights (what
    autocast produces) is computed in float32 and the result cast back to value's dtype, as
    Deformable DETR's ``custom_fwd(cast_inputs=torch.float32)`` does. Differentiable (first
    order) with respect to value, sampling_locations and attention_weights. Exports to ONNX as
    ``ai.opbridge::MultiScaleDeformableAttention``."""
    try:
        if (value.dtype in _LOW and sampling_locations.dtype == torch.float32
                and attention_weights.dtype == torch.float32):
            out = torch.ops.opbridge.ms_deform_attn.default(value.float(), spatial_shapes, level_start_index,
                                                            sampling_locations, attention_weights)
            return cast(torch.Tensor, out.to(value.dtype))
        return cast(torch.Tensor, torch.ops.opbridge.ms_deform_attn.default(value, spatial_shapes, level_start_index,
                                                                            sampling_locations, attention_weights))
    except RuntimeError as e:
        raise_translated(e)
        raise


# Fake kernels and autograd of opbridge::ms_deform_attn and its backward come from their
# declarations (ops/ms_deform_attn/ms_deform_attn_decl.cpp; ops/_torch_adapter.py): first-order
# gradients are opbridge::ms_deform_attn_backward's, second-order ones a clear error.
