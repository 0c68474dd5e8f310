"""Collects the export rules of every op module in opbridge.onnx (no hand-edited list).

An op module (``opbridge/onnx/<op>.py``) may define:
  translations(cfg) -> {torch op overload: onnxscript-building function}   (dynamo exporter)
  symbolics(cfg) -> {"namespace::op": symbolic function}                   (TorchScript exporter)
  schemas() -> [onnx.defs.OpSchema]                                        (ai.opbridge schemas)
  OPS: the op names it handles, for per-op lowering.
Ops of your own, declared with ``opbridge.onnx.declare_op``, are listed after the modules.
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
