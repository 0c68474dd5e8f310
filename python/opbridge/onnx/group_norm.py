"""ONNX export of opbridge::group_norm.

custom lowering: one ``ai.opbridge::GroupNorm`` node (inputs X, scale?, bias?; attributes
num_groups, epsilon, activation), run by opbridge's ORT library. ``activation`` is written only
when it is not "none", so a plain GroupNorm node stays valid for every version of the op.

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

import onnx
from onnx import TensorProto

from ._config import DOMAIN, DOMAIN_VERSION, ExportConfig

OPS = ("group_norm",)
OP_TYPE = "GroupNorm"  # must match opbridge::kGroupNormOpType in the ORT library
ACTIVATIONS = ("none", "silu")  # the attribute's values (opbridge::parse_activation)

_FLOAT_TYPES = ("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)")


def _infer(ctx: Any) -> None:
    """onnx shape inference for GroupNorm: Y has X's type and shape; what is known statically is
    checked like the kernels do (rank >= 2, num_groups divides C, scale/bias have C elements)."""
    from onnx.shape_inference import InferenceError

    x = ctx.get_input_type(0)
    if x is None or not x.HasField("tensor_type"):
        return
    attr = ctx.get_attribute("num_groups")
    num_groups = attr.i if attr is not None else None
    where = f"{DOMAIN}::{OP_TYPE} ({ctx.get_display_name()})"
    act = ctx.get_attribute("activation")
    if act is not None and act.s.decode() not in ACTIVATIONS:
        raise InferenceError(f"{where}: attribute 'activation': activation must be 'none' or 'silu', "
                             f"got '{act.s.decode()}'")
    if num_groups is None:
        raise InferenceError(f"{where}: required int attribute 'num_groups' is missing")
    if num_groups <= 0:
        raise InferenceError(f"{where}: num_groups must be > 0, got {num_groups}")
    if x.tensor_type.HasField("shape"):
        dims = x.tensor_type.shape.dim
        if len(dims) < 2:
            raise InferenceError(f"{where}: X must have rank >= 2 (N, C, *), got rank {len(dims)}")
        if dims[1].HasField("dim_value"):
            c = dims[1].dim_value
            if c % num_groups != 0:
                raise InferenceError(f"{where}: num_groups must divide the number of channels C = X.shape[1] = "
                                     f"{c}, got num_groups = {num_groups}")
            for i, name in ((1, "scale"), (2, "bias")):
                if i >= ctx.get_num_inputs() or not ctx.has_input(i):
                    continue
                t = ctx.get_input_type(i)
                if t is None or not t.tensor_type.HasField("shape"):
                    continue
                sd = t.tensor_type.shape.dim
                if all(d.HasField("dim_value") for d in sd):
                    n = 1
                    for d in sd:
                        n *= d.dim_value
                    if n != c:
                        raise InferenceError(f"{where}: {name} must have C = {c} elements (one per channel), got {n}")
    out = onnx.TypeProto()
    out.CopyFrom(x)
    ctx.set_output_type(0, out)


def schemas() -> list[onnx.defs.OpSchema]:
    S = onnx.defs.OpSchema
    schema = S(
        OP_TYPE,
        DOMAIN,
        DOMAIN_VERSION,
        doc="Group normalization with per-channel scale and bias (semantics of "
        "torch.nn.functional.group_norm and ONNX GroupNormalization-21), followed by an optional "
        "activation (activation='silu': Y = Z * sigmoid(Z)).",
        inputs=[
            S.FormalParameter("X", "T", "Input (N, C, *)"),
            S.FormalParameter("scale", "T", "Per-channel scale (C)", param_option=S.FormalParameterOption.Optional),
            S.FormalParameter("bias", "T", "Per-channel bias (C)", param_option=S.FormalParameterOption.Optional),
        ],
        outputs=[S.FormalParameter("Y", "T", "Output, shape of X")],
        type_constraints=[("T", list(_FLOAT_TYPES), "Float tensors")],
        attributes=[
            S.Attribute("num_groups", S.AttrType.INT, "Number of groups; must divide C", required=True),
            S.Attribute("epsilon", onnx.helper.make_attribute("epsilon", 1e-5), "Added to the variance"),
            # Optional without a declared default value: onnxscript writes declared defaults into
            # every node, and a node should carry the attribute only where it is not "none".
            S.Attribute("activation", S.AttrType.STRING, "Applied after the affine: 'none' (when absent) or 'silu'",
                        required=False),
        ],
    )
    return [schema]


def infer_functions() -> dict:
    """op type -> onnx shape-inference function (see opbridge.onnx._script.register_schemas)."""
    return {OP_TYPE: _infer}


def _check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"opbridge::group_norm: activation must be 'none' or 'silu', got '{activation}'")


def _standard(b: Any, x: Any, num_groups: int, weight: Any, bias: Any, eps: float, activation: str = "none") -> Any:
    """The standard-ONNX lowering, for either exporter (``b`` is an opbridge.onnx._build.Builder)."""
    _check_activation(activation)
    y = _standard_norm(b, x, num_groups, weight, bias, eps)
    if activation == "silu":
        y = b.op("Mul", y, b.op("Sigmoid", y))
    return y


def _standard_norm(b: Any, x: Any, num_groups: int, weight: Any, bias: Any, eps: float) -> Any:
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


def translations(cfg: ExportConfig) -> dict:
    import torch

    from ._build import DynamoBuilder
    from ._script import custom_opset

    if cfg.lowering_for("group_norm") == "standard":
        builder = DynamoBuilder(cfg.resolved_opset(dynamo=True))

        def group_norm_standard(x, num_groups: int, weight=None, bias=None, eps: float = 1e-5,
                                activation: str = "none"):
            return _standard(builder, x, int(num_groups), weight, bias, float(eps), str(activation))

        return {torch.ops.opbridge.group_norm.default: group_norm_standard}

    opset = custom_opset(DOMAIN, cfg.domain_version(DOMAIN, DOMAIN_VERSION))

    def group_norm(x, num_groups: int, weight=None, bias=None, eps: float = 1e-5, activation: str = "none"):
        _check_activation(activation)
        attrs = {} if activation == "none" else {"activation": str(activation)}
        return opset.GroupNorm(x, weight, bias, num_groups=int(num_groups), epsilon=float(eps), **attrs)

    return {torch.ops.opbridge.group_norm.default: group_norm}


def symbolics(cfg: ExportConfig) -> dict:
    from torch.onnx import symbolic_helper as sh

    from ._build import TorchScriptBuilder

    standard = cfg.lowering_for("group_norm") == "standard"

    @sh.parse_args("v", "i", "v", "v", "f", "s")
    def group_norm(g, x, num_groups, weight, bias, eps, activation="none"):
        _check_activation(activation)
        if standard:
            y = _standard(TorchScriptBuilder(g), x, num_groups, weight, bias, eps, activation)
        else:
            scale = weight if not sh._is_none(weight) else sh._optional_input_placeholder_tensor(g)
            shift = bias if not sh._is_none(bias) else sh._optional_input_placeholder_tensor(g)
            attrs = {} if activation == "none" else {"activation_s": activation}
            y = g.op(f"{DOMAIN}::{OP_TYPE}", x, scale, shift, num_groups_i=num_groups, epsilon_f=eps, **attrs)
        y.setType(x.type())
        return y

    return {"opbridge::group_norm": group_norm}
