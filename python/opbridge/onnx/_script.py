"""onnxscript plumbing shared by the translations."""

from __future__ import annotations

import functools

import onnx


@functools.lru_cache(maxsize=None)
def register_schemas() -> None:
    """Registers the OpSchemas of every ai.opbridge op with onnx (once per process), so that
    onnx.checker, onnx.shape_inference and onnxscript know our nodes."""
    from ._registry import op_modules

    for mod in op_modules():
        for schema in getattr(mod, "schemas", lambda: [])():
            if not onnx.defs.has(schema.name, schema.since_version, schema.domain):
                onnx.defs.register_schema(schema)


def custom_opset(domain: str, version: int):
    """An onnxscript Opset for a custom domain whose ops resolve to the registered schemas."""
    import onnxscript

    register_schemas()
    return onnxscript.values.Opset(domain, version)
