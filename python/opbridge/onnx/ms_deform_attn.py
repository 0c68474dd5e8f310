"""ONNX export of opbridge::ms_deform_attn (multi-scale deformable attention).

custom lowering: one ``ai.opbridge::MultiScaleDeformableAttention`` node (since domain version
2; no attributes), run by opbridge's ORT library:
  inputs  value (N, S, M, D) T, spatial_shapes (L, 2) int64, level_start_index (L,) int64,
          sampling_locations (N, Lq, M, L, P, 2) T, attention_weights (N, Lq, M, L, P) T
  output  (N, Lq, M * D) T;  T: float32, float64, float16 or bfloat16.
spatial_shapes and level_start_index may be computed inside the graph (dynamic image sizes):
the node reads them at run time. The TorchScript exporter may type the locations (or weights) as
float64 where the model computes them in float32 (its type promotion of ``offsets /
spatial_shapes``); the symbolic casts them to value's type, so the node stays valid.

A model using this node imports ``ai.opbridge`` at version 2 or later (``opbridge.onnx.export``
sees to it). No standard lowering yet: ``lowering="standard"`` raises NotImplementedError for
models that use the op.
"""

from __future__ import annotations

from typing import Any

import onnx

from ._config import DOMAIN, ExportConfig

OPS = ("ms_deform_attn",)
OP_TYPE = "MultiScaleDeformableAttention"  # must match opbridge::kMsDeformAttnOpType in the ORT library
SINCE_VERSION = 2  # the ai.opbridge domain version that introduced the op
MAX_LEVELS = 16  # kMsDeformAttnMaxLevels

_FLOAT_TYPES = ("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)")
_INPUTS = ("value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights")
_RANKS = (4, 2, 1, 6, 5)


def _dims(t: onnx.TypeProto | None) -> list | None:
    """Dimensions of a tensor type: ints where known, None where symbolic; None for unknown rank."""
    if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in t.tensor_type.shape.dim]


def _infer(ctx: Any) -> None:
    """onnx shape inference: output (N, Lq, M * D) of value's type; what is known statically is
    checked like the kernels do (ms_deform_attn_check), with the same messages."""
    from onnx.shape_inference import InferenceError

    where = f"{DOMAIN}::{OP_TYPE} ({ctx.get_display_name()})"
    types = [ctx.get_input_type(i) if i < ctx.get_num_inputs() and ctx.has_input(i) else None for i in range(5)]
    dims = [_dims(t) for t in types]

    def fail(message: str) -> None:
        raise InferenceError(f"{where}: {message}")

    def shape_str(d: list) -> str:
        return "[" + ", ".join("?" if v is None else str(v) for v in d) + "]"

    value, shapes, starts, loc, aw = dims
    if value is not None and len(value) != 4:
        fail(f"value must have rank 4 (N, S, M, D), got shape {shape_str(value)}")
    if shapes is not None and (len(shapes) != 2 or shapes[1] not in (None, 2)):
        fail(f"spatial_shapes must have shape (L, 2), one (H, W) row per level, got shape {shape_str(shapes)}")
    if starts is not None and len(starts) != 1:
        fail(f"level_start_index must have shape (L,), one start per level, got shape {shape_str(starts)}")
    if loc is not None and (len(loc) != 6 or loc[5] not in (None, 2)):
        fail(f"sampling_locations must have shape (N, Lq, M, L, P, 2), got shape {shape_str(loc)}")
    if aw is not None and len(aw) != 5:
        fail(f"attention_weights must have shape (N, Lq, M, L, P), got shape {shape_str(aw)}")

    def at(d: list | None, i: int) -> int | None:
        return d[i] if d is not None else None

    def agree(a: int | None, b: int | None) -> bool:
        return a is None or b is None or a == b

    n, m, d = at(value, 0), at(value, 2), at(value, 3)
    levels = at(shapes, 0)
    if levels is not None and not 1 <= levels <= MAX_LEVELS:
        fail(f"spatial_shapes must have between 1 and {MAX_LEVELS} rows (one per level), got {levels}")
    if not agree(at(starts, 0), levels):
        fail(f"level_start_index must have L = {levels} elements (one per row of spatial_shapes), got shape "
             f"{shape_str(starts)}")
    if not (agree(at(loc, 0), n) and agree(at(loc, 2), m) and agree(at(loc, 3), levels)):
        q = lambda v: "?" if v is None else v  # noqa: E731
        fail(f"sampling_locations must have shape (N, Lq, M, L, P, 2) with N = value.shape[0] = {q(n)}, M = "
             f"value.shape[2] = {q(m)} and L = spatial_shapes.shape[0] = {q(levels)}, got shape {shape_str(loc)}")
    first = lambda *vs: next((v for v in vs if v is not None), None)  # noqa: E731
    want = [first(at(loc, 0), n), at(loc, 1), first(at(loc, 2), m), first(at(loc, 3), levels), at(loc, 4)]
    if aw is not None and not all(agree(a, b) for a, b in zip(aw, want)):
        fail(f"attention_weights must have shape (N, Lq, M, L, P) = sampling_locations.shape[:5] = "
             f"{shape_str(want)}, got shape {shape_str(aw)}")
    if types[0] is None or not types[0].HasField("tensor_type"):
        return
    # Output dims: N and Lq from whichever input knows (or names) them, M * D when both known.
    out = onnx.TypeProto()
    out.tensor_type.elem_type = types[0].tensor_type.elem_type

    def source(index: int, axis: int) -> onnx.TensorShapeProto.Dimension | None:
        t = types[index]
        if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
            return None
        sd = t.tensor_type.shape.dim
        return sd[axis] if axis < len(sd) else None

    for candidates in (((3, 0), (4, 0), (0, 0)), ((3, 1), (4, 1))):
        dim = out.tensor_type.shape.dim.add()
        known = [c for c in (source(i, a) for i, a in candidates) if c is not None]
        pick = next((c for c in known if c.HasField("dim_value")), None) or next(
            (c for c in known if c.HasField("dim_param")), None)
        if pick is not None:
            dim.CopyFrom(pick)
    md = out.tensor_type.shape.dim.add()
    if m is not None and d is not None:
        md.dim_value = m * d
    ctx.set_output_type(0, out)


def schemas() -> list[onnx.defs.OpSchema]:
    S = onnx.defs.OpSchema
    return [
        S(
            OP_TYPE,
            DOMAIN,
            SINCE_VERSION,
            doc="Multi-scale deformable attention (Deformable DETR): for each query and head, the sum over levels "
            "and points of attention_weights times value bilinearly sampled at sampling_locations (x, y in [0, 1]; "
            "grid_sample semantics, align_corners=False, zero padding). Samples off their map, or at NaN/inf "
            "locations, contribute 0.",
            inputs=[
                S.FormalParameter("value", "T", "(N, S, M, D), S = sum of H * W over the levels"),
                S.FormalParameter("spatial_shapes", "I", "(L, 2): (H, W) of each level"),
                S.FormalParameter("level_start_index", "I", "(L,): first row of each level in value's S axis"),
                S.FormalParameter("sampling_locations", "T", "(N, Lq, M, L, P, 2): (x, y) in [0, 1]"),
                S.FormalParameter("attention_weights", "T", "(N, Lq, M, L, P)"),
            ],
            outputs=[S.FormalParameter("output", "T", "(N, Lq, M * D)")],
            type_constraints=[("T", list(_FLOAT_TYPES), "Float tensors"), ("I", ["tensor(int64)"], "Level sizes")],
        )
    ]


def infer_functions() -> dict:
    """op type -> onnx shape-inference function (see opbridge.onnx._script.register_schemas)."""
    return {OP_TYPE: _infer}


def _version(cfg: ExportConfig) -> int:
    """The ai.opbridge version the node is emitted at: the one asked for, or SINCE_VERSION."""
    version = cfg.domain_version(DOMAIN, SINCE_VERSION)
    if version < SINCE_VERSION:
        raise ValueError(f"{DOMAIN}::{OP_TYPE} exists since {DOMAIN} version {SINCE_VERSION}; custom_opsets asks "
                         f"for version {version}. Leave {DOMAIN} out of custom_opsets or ask for >= {SINCE_VERSION}")
    return max(version, SINCE_VERSION)


def _no_standard() -> NotImplementedError:
    return NotImplementedError(
        "opbridge ms_deform_attn has no standard lowering yet (only stock-ONNX-Runtime ops); export it with "
        "lowering='custom' (or lowering={'ms_deform_attn': 'custom'}) and run the model with opbridge's library")


def translations(cfg: ExportConfig) -> dict:
    import onnxscript
    import torch

    if cfg.lowering_for("ms_deform_attn") == "standard":
        raise _no_standard()

    def ms_deform_attn(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
        # Checked when the op is exported, not when the table is built (models without the op
        # export whatever version they ask for).
        version = _version(cfg)
        op = onnxscript.values.Op(onnxscript.values.Opset(DOMAIN, version), OP_TYPE, schemas()[0])
        return op(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)

    return {torch.ops.opbridge.ms_deform_attn.default: ms_deform_attn}


def symbolics(cfg: ExportConfig) -> dict:
    from torch.onnx import symbolic_helper as sh

    from ._build import _jit_scalar_type

    if cfg.lowering_for("ms_deform_attn") == "standard":
        raise _no_standard()
    jit_type = _jit_scalar_type()

    def scalar_type(v):
        try:
            return jit_type.from_value(v)
        except Exception:  # noqa: BLE001 - untyped value
            return None

    def cast_to(g, v, want):
        """v as `want` (a JitScalarType), with a Cast unless v is known to have that type already."""
        if scalar_type(v) == want:
            return v
        out = g.op("Cast", v, to_i=int(want.onnx_type()))
        return out

    def ms_deform_attn(g, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
        _version(cfg)
        vt = scalar_type(value)
        if vt is not None:
            # float64 grids from the exporter's type promotion (see the module docstring).
            sampling_locations = cast_to(g, sampling_locations, vt)
            attention_weights = cast_to(g, attention_weights, vt)
        spatial_shapes = cast_to(g, spatial_shapes, jit_type.INT64)
        level_start_index = cast_to(g, level_start_index, jit_type.INT64)
        y = g.op(f"{DOMAIN}::{OP_TYPE}", value, spatial_shapes, level_start_index, sampling_locations,
                 attention_weights)
        vs, ls = sh._get_tensor_sizes(value), sh._get_tensor_sizes(sampling_locations)
        if vs is not None and len(vs) == 4:
            m, d = vs[2], vs[3]
            n = ls[0] if ls is not None and len(ls) == 6 and ls[0] is not None else vs[0]
            lq = ls[1] if ls is not None and len(ls) == 6 else None
            y.setType(value.type().with_sizes([n, lq, m * d if m is not None and d is not None else None]))
        return y

    return {"opbridge::ms_deform_attn": ms_deform_attn}
