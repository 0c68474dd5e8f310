"""Standard-ONNX lowering of opbridge::group_norm (its custom lowering, one
``ai.opbridge::GroupNorm`` node, and its schema come from its declaration,
ops/group_norm/group_norm_decl.cpp).

standard lowering (stock ONNX Runtime, no library):
  * export opset >= 21: ``GroupNormalization``-21 (per-channel scale and bias, like torch).
  * below 21: Reshape(N, G, -1) -> InstanceNormalization -> Reshape back -> Mul(scale) ->
    Add(bias). float16/bfloat16 are computed in float32 (ORT has no bfloat16 InstanceNormalization;
    float32 statistics also match torch's); float64 uses ReduceMean/Sub/Div because ORT's CPU
    InstanceNormalization has no float64 kernel and float32 would lose the precision asked for.
  GroupNormalization-18 is never emitted: its scale and bias are per group, not per channel, and
  opset 21 deprecates it.
  activation="silu" appends Sigmoid -> Mul (y * sigmoid(y)), as the exporters write F.silu.
"""

from __future__ import annotations

from typing import Any

from onnx import TensorProto

from ._registry import standard_lowering

@standard_lowering("opbridge::group_norm")
def standard(b: Any, x: Any, num_groups: int, weight: Any, bias: Any, eps: float, activation: str) -> Any:
    """The standard-ONNX lowering, for either exporter (``b`` is an opbridge.onnx.Builder;
    every argument as the call has it, defaults applied from the declaration); activation "silu"
    appends x * Sigmoid(x)."""
    y = _standard(b, x, int(num_groups), weight, bias, float(eps))
    if activation == "silu":
        y = b.op("Mul", y, b.op("Sigmoid", y))
    return y


def _standard(b: Any, x: Any, num_groups: int, weight: Any, bias: Any, eps: float) -> Any:
    elem = b.elem_type(x)
    if b.target_opset >= 21:
        # GroupNormalization-21 requires scale and bias: ones / zeros of length C = X.shape[1]
        # (constants when C is static, else shaped from X at run time).
        c = b.dim(x, 1)
        for name, fill in (("weight", 1.0), ("bias", 0.0)):
            if not b.is_none(weight if name == "weight" else bias):
                continue
            if c is not None:
                value = b.const(elem, [c], [fill] * c)
            else:
                value = b.op("ConstantOfShape", b.op("Shape", x, start=1, end=2), value=b.scalar_tensor(elem, fill))
            if name == "weight":
                weight = value
            else:
                bias = value
        # stash_type: precision of the statistics; its default (float32) would truncate float64.
        stash = TensorProto.DOUBLE if elem == TensorProto.DOUBLE else TensorProto.FLOAT
        return b.op("GroupNormalization", x, weight, bias, num_groups=int(num_groups), epsilon=float(eps),
                    stash_type=stash)

    rank = b.rank(x)
    if rank is None:
        raise ValueError("opbridge group_norm: the standard lowering below opset 21 needs the rank of x; "
                         "export with opset_version=21 or lowering='custom'")
    compute = TensorProto.FLOAT if elem in (TensorProto.FLOAT16, TensorProto.BFLOAT16) else elem
    xc = x if compute == elem else b.op("Cast", x, to=compute)
    grouped = b.op("Reshape", xc, b.const_ints([0, num_groups, -1]))
    if compute == TensorProto.DOUBLE:
        y = _normalize_last_axis(b, grouped, eps, compute)
    else:
        ones = b.const(compute, [num_groups], [1.0] * num_groups)
        zeros = b.const(compute, [num_groups], [0.0] * num_groups)
        y = b.op("InstanceNormalization", grouped, ones, zeros, epsilon=float(eps))
    y = b.op("Reshape", y, b.op("Shape", xc))
    # (C,) -> (C, 1, ..., 1): broadcast over the spatial axes of (N, C, *).
    per_channel = b.const_ints([-1] + [1] * (rank - 2))
    for param, combine in ((weight, "Mul"), (bias, "Add")):
        if b.is_none(param):
            continue
        p = param if compute == elem else b.op("Cast", param, to=compute)
        y = b.op(combine, y, b.op("Reshape", p, per_channel))
    return y if compute == elem else b.op("Cast", y, to=elem)


def _normalize_last_axis(b: Any, x: Any, eps: float, elem: int) -> Any:
    """(x - mean) / sqrt(var + eps) over the last axis of a rank-3 tensor, from primitive ops."""

    def mean(v: Any) -> Any:
        if b.opset >= 18:  # axes became an input in ReduceMean-18
            return b.op("ReduceMean", v, b.const_ints([2]), keepdims=1)
        return b.op("ReduceMean", v, axes=[2], keepdims=1)

    centered = b.op("Sub", x, mean(x))
    var = mean(b.op("Mul", centered, centered))
    return b.op("Div", centered, b.op("Sqrt", b.op("Add", var, b.const(elem, [], [float(eps)]))))
