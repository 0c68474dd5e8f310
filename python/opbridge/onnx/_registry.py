"""Collects the export rules of every op module in opbridge.onnx (no hand-edited list).

An op module (``opbridge/onnx/<op>.py``) may define:
  OPS: the op names it handles (keys of per-op ``lowering={...}``).
  translations(cfg) -> {torch op overload: onnxscript-building function}   (dynamo exporter)
  symbolics(cfg) -> {"namespace::op": symbolic function}                   (TorchScript exporter)
  schemas() -> [onnx.defs.OpSchema]                                        (ai.opbridge schemas)
  infer_functions() -> {op type: fn(onnx InferenceContext)}                (shape inference of those)
Ops of your own, declared with ``opbridge.onnx.declare_op``, are listed after the modules.

Op modules must not import torch at module level (only inside translations/symbolics): importing
opbridge.onnx registers the schemas, and that has to work where torch is not installed.
"""

from __future__ import annotations

import importlib
import pkgutil


def op_modules() -> list:
    from . import __path__ as pkg_path

    mods = []
    for m in sorted(pkgutil.iter_modules(pkg_path), key=lambda m: m.name):
        if m.name.startswith("_"):
            continue
        mods.append(importlib.import_module(f"opbridge.onnx.{m.name}"))
    return mods + list(_declared.values())


# torch op name -> CustomOp (opbridge/onnx/_custom.py), in declaration order.
_declared: dict = {}


def add_declared_op(op) -> None:
    _declared.pop(op.torch_op, None)
    _declared[op.torch_op] = op


def op_names() -> set[str]:
    """Every op name some module lists in OPS."""
    return {name for mod in op_modules() for name in getattr(mod, "OPS", ())}
