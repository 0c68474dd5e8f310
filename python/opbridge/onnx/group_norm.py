"""ONNX export of opbridge::group_norm.

custom lowering: one ``ai.opbridge::GroupNorm`` node (inputs X, scale?, bias?; attributes
num_groups, epsilon), run by opbridge's ORT library.
"""

from __future__ import annotations

import onnx

from ._config import DOMAIN, DOMAIN_VERSION, ExportConfig

OPS = ("group_norm",)
OP_TYPE = "GroupNorm"  # must match opbridge::kGroupNormOpType in the ORT library


def schemas() -> list[onnx.defs.OpSchema]:
    S = onnx.defs.OpSchema
    return [
        S(
            OP_TYPE,
            DOMAIN,
            DOMAIN_VERSION,
            doc="Group normalization with per-channel scale and bias (semantics of "
            "torch.nn.functional.group_norm and ONNX GroupNormalization-21).",
            inputs=[
                S.FormalParameter("X", "T", "Input (N, C, *)"),
                S.FormalParameter("scale", "T", "Per-channel scale (C)", param_option=S.FormalParameterOption.Optional),
                S.FormalParameter("bias", "T", "Per-channel bias (C)", param_option=S.FormalParameterOption.Optional),
            ],
            outputs=[S.FormalParameter("Y", "T", "Output, shape of X")],
            type_constraints=[
                ("T", ["tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"], "Float tensors"),
            ],
            attributes=[
                S.Attribute("num_groups", S.AttrType.INT, "Number of groups; must divide C", required=True),
                S.Attribute("epsilon", onnx.helper.make_attribute("epsilon", 1e-5), "Added to the variance"),
            ],
        )
    ]


def translations(cfg: ExportConfig) -> dict:
    import torch

    from ._script import custom_opset

    lowering = cfg.lowering_for("group_norm")
    if lowering != "custom":
        raise NotImplementedError(f"group_norm: lowering {lowering!r} is not available")
    opset = custom_opset(DOMAIN, cfg.domain_version(DOMAIN, DOMAIN_VERSION))

    def group_norm(x, num_groups: int, weight=None, bias=None, eps: float = 1e-5):
        return opset.GroupNorm(x, weight, bias, num_groups=int(num_groups), epsilon=float(eps))

    return {torch.ops.opbridge.group_norm.default: group_norm}


def symbolics(cfg: ExportConfig) -> dict:
    from torch.onnx import symbolic_helper as sh

    lowering = cfg.lowering_for("group_norm")
    if lowering != "custom":
        raise NotImplementedError(f"group_norm: lowering {lowering!r} is not available")

    @sh.parse_args("v", "i", "v", "v", "f")
    def group_norm(g, x, num_groups, weight, bias, eps):
        scale = weight if not sh._is_none(weight) else sh._optional_input_placeholder_tensor(g)
        shift = bias if not sh._is_none(bias) else sh._optional_input_placeholder_tensor(g)
        y = g.op(f"{DOMAIN}::{OP_TYPE}", x, scale, shift, num_groups_i=num_groups, epsilon_f=eps)
        y.setType(x.type())
        return y

    return {"opbridge::group_norm": group_norm}
