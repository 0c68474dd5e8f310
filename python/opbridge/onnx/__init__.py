"""ONNX export of models that use opbridge ops, with either torch exporter.

* ``export(model, args, f, dynamo=True, lowering="custom", ...)``: one call, both exporters,
  dynamic batch; ``lowering="standard"`` (or ``{"group_norm": "standard"}`` per op) gives a model
  that stock ONNX Runtime runs without opbridge's library.
* ``translation_table()``: pass as ``custom_translation_table`` to ``torch.onnx.export(..., dynamo=True)``.
* ``register_symbolics()``: for ``torch.onnx.export(..., dynamo=False)`` (TorchScript exporter).
* ``declare_op(...)``: export rules for an op of your own (docs/cpp.md, "Writing your own op").
* ``infer_shapes(model)``: onnx shape inference that understands ``ai.opbridge`` nodes.

Importing this module registers the ``ai.opbridge`` OpSchemas (with shape inference) with onnx,
so that ``onnx.checker.check_model(model, full_check=True)`` and ``onnx.shape_inference`` accept
models that use them. It needs onnx, not torch.
"""

from __future__ import annotations

import os

import onnx

from .._op_library import on_register as _on_register
from ._build import Builder
from .._library import DOMAIN
from ._config import DOMAIN_VERSION, LOWERINGS, ExportConfig
from ._custom import CustomOp, declare_op
from ._declared_export import register_shape_inference, register_symbolic, register_translation
from ._export import export
from ._exporter_rules import register_symbolics, symbolics_registered, translation_table
from ._registry import standard_lowering
from ._script import infer_shapes, register_schemas

__all__ = [
    "Builder",
    "CustomOp",
    "DOMAIN",
    "DOMAIN_VERSION",
    "LOWERINGS",
    "ExportConfig",
    "check_attributes",
    "declare_op",
    "export",
    "infer_shapes",
    "register_schemas",
    "register_shape_inference",
    "register_symbolic",
    "register_symbolics",
    "register_translation",
    "standard_lowering",
    "symbolics_registered",
    "translation_table",
]

# The schemas carry Python shape-inference functions: onnx 1.19-1.22 hang or crash the interpreter
# at exit once one is registered, and older onnx cannot carry them.
if tuple(int(p) for p in onnx.__version__.split(".")[:2]) < (1, 23):
    raise ImportError(f"opbridge.onnx needs onnx>=1.23, but onnx {onnx.__version__} is installed: "
                      'pip install -U "opbridge[tools]"')
register_schemas()
# Libraries registered later (users' ops) get their schemas when they are registered.
_on_register(lambda _library: register_schemas())


def check_attributes(model: onnx.ModelProto | str | os.PathLike[str]) -> list[str]:
    """Problems ONNX Runtime cannot see in a model's declared-op nodes: unknown (e.g. misspelled)
    attribute names and attributes newer than the op version the model imports. ``model``: a
    ModelProto or a path. Empty when there are none. opbridge.InferenceSession and `opbridge
    check` run it; onnx.checker finds unknown attributes through our OpSchemas too."""
    from . import _reader
    from ._declared_export import attribute_problems

    if not isinstance(model, onnx.ModelProto):
        path, model = model, _reader.read_graph(model)
        _reader.check(model, path)
    return attribute_problems(model)
