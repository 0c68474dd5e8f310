"""ONNX export of opbridge::ms_deform_attn (multi-scale deformable attention).

custom lowering: one ``ai.opbridge::MultiScaleDeformableAttention`` node (since domain version
2), run by opbridge's ORT library; its schema, shape inference and both exporters' rules come from
the op's declaration (ops/ms_deform_attn/ms_deform_attn_decl.cpp):
  inputs  value (N, S, M, D) T, spatial_shapes (L, 2) int64, level_start_index (L,) int64,
          sampling_locations (N, Lq, M, L, P, 2) T, attention_weights (N, Lq, M, L, P) T
  output  (N, Lq, M * D) T;  T: float32, float64, float16 or bfloat16.
spatial_shapes and level_start_index may be computed inside the graph (dynamic image sizes): the
node reads them at run time. The TorchScript exporter may type the locations (or weights) as
float64 where the model computes them in float32 (its type promotion of ``offsets /
spatial_shapes``); the declared symbolic casts inputs of one type variable to the type of its
first one, so the node stays valid.

standard lowering (``lowering="standard"``, stock ONNX Runtime, no library; opset >= 16): per level l
  value_l = value[:, start_l : start_l + H_l*W_l] -> (N, M, D, H_l*W_l) -> (N*M, D, H_l, W_l)
  grid_l  = 2 * sampling_locations[:, :, :, l] - 1 -> (N*M, Lq, P, 2)
  out    += ReduceSum(GridSample(value_l, grid_l) * attention_weights[:, :, :, l], over P)
(GridSample with its defaults: bilinear, zero padding, align_corners=0 -- exactly the op's
semantics), then (N*M, D, Lq) -> (N, Lq, M*D). Summing level by level avoids the Concat of every
level's samples that the exported pure-PyTorch function builds. H_l, W_l, start_l are read from
spatial_shapes / level_start_index inside the graph (Gather/Slice), so dynamic image sizes work;
ORT folds them to constants when those inputs are constants. The number of levels L must be
static (the node count depends on it). The grid is always a float tensor of the value's type
(the TorchScript exporter's float64 locations are cast back: ORT has no float64 grid with float
data). ORT's CPU GridSample runs float32 only, so float16/bfloat16/float64 inputs are computed in
float32 and the result cast back (float64 loses precision there: use the custom lowering when it
matters). NaN/inf locations get whatever GridSample makes of them, not necessarily the custom
op's "contributes 0".
"""

from __future__ import annotations

from typing import Any

from onnx import TensorProto

from ._registry import standard_lowering


@standard_lowering("opbridge::ms_deform_attn", min_opset=16)
def standard(b: Any, value: Any, spatial_shapes: Any, level_start_index: Any, sampling_locations: Any,
             attention_weights: Any) -> Any:
    levels = next((d for d in (b.dim(spatial_shapes, 0), b.dim(level_start_index, 0), b.dim(sampling_locations, 3),
                               b.dim(attention_weights, 3)) if d is not None), None)
    if levels is None:
        raise ValueError("opbridge ms_deform_attn: the standard lowering needs a static number of levels "
                         "(spatial_shapes.shape[0]); export with lowering='custom'")
    elem = b.elem_type(value)
    compute = TensorProto.FLOAT

    def cast(x: Any) -> Any:
        return x if b.elem_type(x) == compute else b.op("Cast", x, to=compute)

    value, loc, weights = cast(value), cast(sampling_locations), cast(attention_weights)
    grid = b.op("Sub", b.op("Mul", loc, b.const(compute, [], [2.0])), b.const(compute, [], [1.0]))

    def size(x: Any, axis: int) -> Any:
        # Gather, not Shape(start, end): the TorchScript exporter's shape inference ignores
        # Shape's start/end for static shapes, infers a wrong rank downstream and crashes.
        return b.op("Gather", b.op("Shape", x), b.const_ints([axis]), axis=0)

    n, d = size(value, 0), size(value, 3)
    lq, p = size(loc, 1), size(loc, 4)
    minus_one = b.const_ints([-1])
    grid_shape = b.op("Concat", minus_one, lq, p, b.const_ints([2]), axis=0)
    weight_shape = b.op("Concat", b.const_ints([-1, 1]), lq, p, axis=0)
    # (N, S, M, D) -> (N, M, D, S) once; each level is then a slice of the last axis.
    value_t = b.op("Transpose", value, perm=[0, 2, 3, 1])
    out = None
    for l in range(levels):
        index = b.const(TensorProto.INT64, [], [l])
        hw = b.op("Gather", spatial_shapes, index, axis=0)  # (2,) = [H_l, W_l]
        start = b.op("Gather", level_start_index, b.const_ints([l]), axis=0)  # (1,)
        end = b.op("Add", start, b.op("ReduceProd", hw, keepdims=1))
        value_l = b.op("Slice", value_t, start, end, b.const_ints([3]))
        value_l = b.op("Reshape", value_l, b.op("Concat", minus_one, d, hw, axis=0))  # (N*M, D, H_l, W_l)
        grid_l = b.op("Transpose", b.op("Gather", grid, index, axis=3), perm=[0, 2, 1, 3, 4])
        grid_l = b.op("Reshape", grid_l, grid_shape)  # (N*M, Lq, P, 2)
        sampled = b.op("GridSample", value_l, grid_l)  # (N*M, D, Lq, P)
        w_l = b.op("Transpose", b.op("Gather", weights, index, axis=3), perm=[0, 2, 1, 3])
        w_l = b.op("Reshape", w_l, weight_shape)  # (N*M, 1, Lq, P)
        term = b.op("ReduceSum", b.op("Mul", sampled, w_l), b.const_ints([3]), keepdims=0)  # (N*M, D, Lq)
        out = term if out is None else b.op("Add", out, term)
    out = b.op("Reshape", out, b.op("Concat", n, minus_one, lq, axis=0))  # (N, M*D, Lq)
    out = b.op("Transpose", out, perm=[0, 2, 1])  # (N, Lq, M*D)
    return out if elem == compute else b.op("Cast", out, to=elem)
