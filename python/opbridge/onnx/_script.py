"""Schemas of the ai.opbridge ops for onnx, and onnxscript plumbing shared by the translations."""

from __future__ import annotations

from typing import Any, Callable

import onnx


def _sources() -> list[tuple[onnx.defs.OpSchema, Callable[[Any], None] | None]]:
    """(schema, shape-inference function) of every op opbridge knows: the declared ops of every
    known library (all their versions) and the ops of Python-side declare_op declarations."""
    from .._op_library import libraries
    from ._declared_export import infer_function, schemas
    from ._registry import _declared_rules

    out: list[tuple[onnx.defs.OpSchema, Callable[[Any], None] | None]] = []
    for lib in libraries():
        for op in lib.ops.values():
            fn = infer_function(op)
            out += [(schema, fn) for schema in schemas(op)]
    for rule in _declared_rules.values():
        out += [(schema, None) for schema in rule.schemas()]
    return out


def register_schemas() -> None:
    """Registers the OpSchemas of every op opbridge knows (all versions) with onnx, so that
    onnx.checker, onnx.shape_inference and onnxscript know our nodes; idempotent, and cheap to
    call again after a library was registered. Each schema carries its op's shape-inference
    function."""
    for schema, fn in _sources():
        # has() is true for any version <= since_version: compare the exact version, so that an
        # op's later versions are registered after its first.
        if (onnx.defs.has(schema.name, schema.since_version, schema.domain)
                and onnx.defs.get_schema(schema.name, schema.since_version, schema.domain).since_version
                == schema.since_version):
            continue
        if fn is not None:
            schema.set_type_and_shape_inference_function(fn)
        onnx.defs.register_schema(schema)


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx.shape_inference.infer_shapes that also types the outputs of ai.opbridge nodes (the
    registered schemas carry the inference functions)."""
    register_schemas()
    return onnx.shape_inference.infer_shapes(model)


def custom_opset(domain: str, version: int) -> Any:
    """An onnxscript Opset for a custom domain whose ops resolve to the registered schemas."""
    import onnxscript

    register_schemas()
    return onnxscript.values.Opset(domain, version)
