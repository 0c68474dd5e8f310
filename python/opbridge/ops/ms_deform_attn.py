"""opbridge.ops.ms_deform_attn: multi-scale deformable attention (Deformable DETR) as a torch
custom op with fake kernels and autograd."""

from __future__ import annotations

import torch

from ._declared import register_autograd, register_formula
from ._errors import raise_translated

__all__ = ["ms_deform_attn"]

_OP = "opbridge::ms_deform_attn"
_BACKWARD_OP = "opbridge::ms_deform_attn_backward"
# kMsDeformAttnMaxLevels in cpp/include/opbridge/ms_deform_attn.h.
MAX_LEVELS = 16
_FLOAT = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
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
            return out.to(value.dtype)
        return torch.ops.opbridge.ms_deform_attn.default(value, spatial_shapes, level_start_index,
                                                         sampling_locations, attention_weights)
    except RuntimeError as e:
        raise_translated(e)
        raise


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _check_shapes(op, value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                  grad_output=None):
    """What ms_deform_attn_check (C++) checks from shapes and dtypes alone, in its order and with
    its messages: the fake kernels run it (values of spatial_shapes / level_start_index are not
    available there). Symbolic dimensions stay symbolic: equalities become deferred runtime
    assertions (torch._check_*), never specializations."""
    floats = "a float32, float64, float16 or bfloat16 tensor"
    torch._check_type(value.dtype in _FLOAT, lambda: f"{op}: value must be {floats}, got {_name(value.dtype)}")
    for t, name in ((sampling_locations, "sampling_locations"), (attention_weights, "attention_weights"),
                    (grad_output, "grad_output")):
        if t is not None:
            torch._check_type(t.dtype == value.dtype, lambda: f"{op}: {name} must have the dtype of value "
                              f"({_name(value.dtype)}), got {_name(t.dtype)}")
    for t, name in ((spatial_shapes, "spatial_shapes"), (level_start_index, "level_start_index")):
        torch._check_type(t.dtype == torch.int64, lambda: f"{op}: {name} must be an int64 tensor, got {_name(t.dtype)}")
    # Devices (the fake kernel also serves the Meta key, which wins when any argument is a meta
    # tensor: without this a CPU value with a meta weight would give an uninitialized result).
    # spatial_shapes / level_start_index may live on the CPU whatever value's device.
    for t, name in ((sampling_locations, "sampling_locations"), (attention_weights, "attention_weights"),
                    (grad_output, "grad_output"), (spatial_shapes, "spatial_shapes"),
                    (level_start_index, "level_start_index")):
        if t is None:
            continue
        ok = t.device == value.device or (name in ("spatial_shapes", "level_start_index") and t.device.type == "cpu")
        torch._check_value(ok, lambda: f"{op}: {name} must be on value's device ({value.device}), got {t.device}")

    def shape(t):
        return list(t.shape)

    def check_all(conds, message):
        # One torch._check_value per condition: `a and b` on symbolic sizes would call bool() on
        # them, which specializes (or guards on) the sizes.
        for cond in conds:
            torch._check_value(cond, message)

    torch._check_value(value.dim() == 4, lambda: f"{op}: value must have rank 4 (N, S, M, D), got shape {shape(value)}")
    ss_message = (lambda: f"{op}: spatial_shapes must have shape (L, 2), one (H, W) row per level, got shape "
                  f"{shape(spatial_shapes)}")
    torch._check_value(spatial_shapes.dim() == 2, ss_message)
    torch._check_value(spatial_shapes.shape[1] == 2, ss_message)
    torch._check_value(level_start_index.dim() == 1,
                       lambda: f"{op}: level_start_index must have shape (L,), one start per level, got shape "
                       f"{shape(level_start_index)}")
    loc = sampling_locations
    loc_message = lambda: f"{op}: sampling_locations must have shape (N, Lq, M, L, P, 2), got shape {shape(loc)}"  # noqa: E731
    torch._check_value(loc.dim() == 6, loc_message)
    torch._check_value(loc.shape[5] == 2, loc_message)
    aw = attention_weights
    torch._check_value(aw.dim() == 5,
                       lambda: f"{op}: attention_weights must have shape (N, Lq, M, L, P), got shape {shape(aw)}")
    if grad_output is not None:
        torch._check_value(grad_output.dim() == 3, lambda: f"{op}: grad_output must have shape (N, Lq, M * D), got "
                           f"shape {shape(grad_output)}")
    n, s, m, d = value.shape
    levels = spatial_shapes.shape[0]
    check_all((levels >= 1, levels <= MAX_LEVELS), lambda: f"{op}: spatial_shapes must have between 1 and "
              f"{MAX_LEVELS} rows (one per level), got {levels}")
    torch._check_value(level_start_index.shape[0] == levels,
                       lambda: f"{op}: level_start_index must have L = {levels} elements (one per row of "
                       f"spatial_shapes), got shape {shape(level_start_index)}")
    check_all((loc.shape[0] == n, loc.shape[2] == m, loc.shape[3] == levels),
              lambda: f"{op}: sampling_locations must have shape (N, Lq, M, L, P, 2) with N = value.shape[0] = {n}, "
              f"M = value.shape[2] = {m} and L = spatial_shapes.shape[0] = {levels}, got shape {shape(loc)}")
    check_all([aw.shape[i] == loc.shape[i] for i in range(5)],
              lambda: f"{op}: attention_weights must have shape (N, Lq, M, L, P) = sampling_locations.shape[:5] = "
              f"{shape(loc)[:5]}, got shape {shape(aw)}")
    if grad_output is not None:
        want = [loc.shape[0], loc.shape[1], m * d]
        check_all([grad_output.shape[i] == want[i] for i in range(3)],
                  lambda: f"{op}: grad_output must have the output's shape (N, Lq, M * D) = {want}, got shape "
                  f"{shape(grad_output)}")
    return n, loc.shape[1], m, d


# The forward's fake kernel comes from its declaration (ops/_declared.py).


@torch.library.register_fake(_BACKWARD_OP)
def _ms_deform_attn_backward_fake(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                                  attention_weights):
    _check_shapes(_BACKWARD_OP, value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                  grad_output)
    return (
        torch.empty_like(value, memory_format=torch.contiguous_format),
        torch.empty_like(sampling_locations, memory_format=torch.contiguous_format),
        torch.empty_like(attention_weights, memory_format=torch.contiguous_format),
    )


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    value, spatial_shapes, level_start_index, loc, weights = ctx.saved_tensors
    grad_value, grad_loc, grad_weights = torch.ops.opbridge.ms_deform_attn_backward.default(
        grad, value, spatial_shapes, level_start_index, loc, weights)
    need = ctx.needs_input_grad
    return (grad_value if need[0] else None, None, None, grad_loc if need[3] else None,
            grad_weights if need[4] else None)


register_autograd(_OP, _backward, setup_context=_setup_context, backward_op=_BACKWARD_OP, backward_op_grads=(0, 3, 4))


def _no_double_backward(ctx, *grads):
    raise NotImplementedError(
        f"{_OP}: second-order gradients (differentiating its backward, e.g. torch.autograd.grad(..., "
        "create_graph=True) followed by another backward) are not implemented")


# The backward op is differentiable only in name: differentiating it raises instead of silently
# treating its outputs as constants.
register_formula(_BACKWARD_OP, _no_double_backward, lambda ctx, inputs, output: None)
