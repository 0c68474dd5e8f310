"""Schemas of the ai.opbridge ops for onnx, and onnxscript plumbing shared by the translations."""

from __future__ import annotations

from typing import Any, Callable

import onnx


def _sources() -> list[tuple[onnx.defs.OpSchema, Callable[[Any], None] | None]]:
    """(schema, shape-inference function) of every op opbridge knows: the declared ops of every
    known library (all their versions) and the ops of Python-side declare_op declarations."""
    from .._decl import libraries
    from ._declared import infer_function, schemas
    from ._registry import _declared

    out = []
    for lib in libraries():
        for op in lib.ops.values():
            fn = infer_function(op)
            out += [(schema, fn) for schema in schemas(op)]
    for legacy in _declared.values():
        out += [(schema, None) for schema in legacy.schemas()]
    return out


def _infer_functions() -> dict[tuple[str, str], Callable[[Any], None]]:
    return {(schema.domain, schema.name): fn for schema, fn in _sources() if fn is not None}


def python_inference_supported() -> bool:
    """Whether this onnx lets a Python OpSchema carry a shape-inference function (onnx 1.17 and
    older do not)."""
    return hasattr(onnx.defs.OpSchema, "set_type_and_shape_inference_function")


def register_schemas() -> None:
    """Registers the OpSchemas of every op opbridge knows (all versions) with onnx, so that
    onnx.checker, onnx.shape_inference and onnxscript know our nodes; idempotent, and cheap to
    call again after a library was registered. Where onnx supports it, each schema carries its
    op's shape-inference function; infer_shapes() covers older onnx."""
    for schema, fn in _sources():
        # has() is true for any version <= since_version: compare the exact version, so that an
        # op's later versions are registered after its first.
        if (onnx.defs.has(schema.name, schema.since_version, schema.domain)
                and onnx.defs.get_schema(schema.name, schema.since_version, schema.domain).since_version
                == schema.since_version):
            continue
        if fn is not None and python_inference_supported():
            schema.set_type_and_shape_inference_function(fn)
        onnx.defs.register_schema(schema)


class _Context:
    """The part of onnx's InferenceContext the op inference functions use, over a graph's known
    value types (for onnx without Python inference functions)."""

    def __init__(self, node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> None:
        self.node = node
        self.types = types
        self.outputs: dict[int, onnx.TypeProto] = {}

    def get_num_inputs(self) -> int:
        return len(self.node.input)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.input) and self.node.input[i] != ""

    def get_input_type(self, i: int) -> onnx.TypeProto | None:
        return self.types.get(self.node.input[i]) if self.has_input(i) else None

    def get_attribute(self, name: str) -> onnx.AttributeProto | None:
        return next((a for a in self.node.attribute if a.name == name), None)

    def get_display_name(self) -> str:
        return f"node {self.node.name!r}" if self.node.name else "unnamed node"

    def set_output_type(self, i: int, t: onnx.TypeProto) -> bool:
        self.outputs[i] = t
        return True


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx.shape_inference.infer_shapes that also types the outputs of ai.opbridge nodes.

    With onnx >= 1.18 the registered schemas carry the inference functions and this is one onnx
    call. With older onnx, opbridge's functions fill value_info for our nodes and onnx's inference
    runs again to propagate past them, until nothing changes."""
    register_schemas()
    inferred = onnx.shape_inference.infer_shapes(model)
    if python_inference_supported():
        return inferred
    infer = _infer_functions()
    for _ in range(len(inferred.graph.node) + 1):
        g = inferred.graph
        types = {vi.name: vi.type for vi in (*g.input, *g.value_info, *g.output)}
        types.update({t.name: onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims)) for t in g.initializer})
        added = False
        for node in g.node:
            fn = infer.get((node.domain, node.op_type))
            if fn is None or all(o in types and types[o].tensor_type.HasField("shape") for o in node.output if o):
                continue
            ctx = _Context(node, types)
            fn(ctx)
            for i, t in ctx.outputs.items():
                name = node.output[i]
                if name and name not in {vi.name for vi in g.output}:
                    g.value_info.append(onnx.helper.make_value_info(name, t))
                    types[name] = t
                    added = True
        if not added:
            break
        inferred = onnx.shape_inference.infer_shapes(inferred)
    return inferred


def custom_opset(domain: str, version: int):
    """An onnxscript Opset for a custom domain whose ops resolve to the registered schemas."""
    import onnxscript

    register_schemas()
    return onnxscript.values.Opset(domain, version)
