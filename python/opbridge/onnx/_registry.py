"""The export rules of every op, computed when an export asks for them (so ops declared or
libraries registered later are included, and nothing is registered with torch ahead of time).

Rule sets (each with ``OPS``: its ``lowering`` keys, ``translations(cfg)`` and ``symbolics(cfg)``):
  * every declared op of every known library (opbridge/_op_library.py): its custom lowering is derived
    from the declaration (opbridge/onnx/_declared_export.py), its standard lowering is what
    :func:`standard_lowering` registered for it (ours: opbridge/onnx/<op>.py), if anything;
  * rules for torch's own ops that opbridge lowers (modules of opbridge/onnx defining ``RULES``,
    e.g. torch.inverse in inverse.py);
  * ops exported through a Python-side ``declare_op`` (opbridge/onnx/_custom.py).

Lowering keys: ``"namespace::op"`` (the torch op, e.g. ``"opbridge::group_norm"`` or
``"myops::rms_norm"``); the bare op name (``"group_norm"``) also works where it is unambiguous.
Torch's own ops have keys of their own (``"torch_inverse"``).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from typing import Any, Callable

from .._declarations import OpDecl

from .._op_library import libraries
from ._config import ExportConfig

__all__ = ["op_names", "rule_sets", "standard_lowering"]

# Keys of the warnings given during the current export (see once_per_export).
_said: set[str] = set()


def once_per_export(key: str, say: Callable[[], None]) -> None:
    """Calls ``say`` (e.g. a warnings.warn) the first time ``key`` comes up in an export; every
    export starts afresh (opbridge.onnx.export calls new_export)."""
    if key not in _said:
        _said.add(key)
        say()


def new_export() -> None:
    _said.clear()


# qualname -> (function(builder, *torch args), lowest default-domain opset it works at)
_standard: dict[str, tuple[Callable[..., Any], int]] = {}


def standard_lowering(op: str, *, min_opset: int = 1) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Registers the standard-ONNX lowering of a declared op (decorator), used with
    ``lowering="standard"``: ``fn(b, *args)`` gets an opbridge.onnx.Builder ``b`` and the torch
    op's arguments (tensor inputs as graph values, attributes as Python values) and returns the
    output value. ``min_opset``: the lowest default-domain opset it can express the op at."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        _standard[op] = (fn, int(min_opset))
        return fn

    return register


def _call_standard(fn: Callable[..., Any], op: OpDecl, builder: Any, values: list[Any]) -> Any:
    """``fn(builder, *values)`` for a standard lowering that takes every argument of ``op``'s
    declaration; one written before an argument was declared gets the arguments it takes, and a
    call that gives a left-out argument anything but its default cannot be expressed by it (a
    clear NotImplementedError instead of a silently different model)."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        return fn(builder, *values)
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return fn(builder, *values)
    takes = {p.name for p in params}
    if all(a.name in takes for a in op.args):
        return fn(builder, *values)
    kwargs = {}
    for a, v in zip(op.args, values):
        if a.name in takes:
            kwargs[a.name] = v
        elif hasattr(a, "optional") and v is not None:
            raise NotImplementedError(f"{op.qualname}: its standard ONNX lowering does not take the input {a.name}; "
                                      "export it with lowering 'custom'")
        elif not hasattr(a, "optional") and not a.is_default(v):
            raise NotImplementedError(f"{op.qualname}: its standard ONNX lowering does not take {a.name} (= {v!r}, "
                                      f"the default is {a.default!r}); export it with lowering 'custom'")
    return fn(builder, **kwargs)


class DeclaredRules:
    """Export rules of one declared op."""

    def __init__(self, op: OpDecl, keys: tuple[str, ...]) -> None:
        self.op = op
        self.OPS = keys

    def __repr__(self) -> str:
        return f"DeclaredRules({self.op.qualname})"

    def overload(self) -> Any:
        import torch

        ns, name = self.op.qualname.split("::")
        return getattr(getattr(torch.ops, ns), name).default

    def _standard(self, cfg: ExportConfig, dynamo: bool) -> tuple[Callable[..., Any], int]:
        entry = _standard.get(self.op.qualname)
        if entry is None:
            raise NotImplementedError(
                f"{self.op.qualname} has no standard ONNX lowering: export it with lowering 'custom' "
                f"(a {self.op.domain}::{self.op.onnx_type} node, run with its custom-op library), or register one "
                "with opbridge.onnx.standard_lowering")
        fn, min_opset = entry
        opset = cfg.resolved_opset(dynamo)
        if opset < min_opset:
            raise NotImplementedError(f"{self.op.qualname}: the standard lowering needs opset >= {min_opset}, "
                                      f"the export uses {opset}")
        return fn, opset

    def loaded(self) -> bool:
        """Whether the torch op exists (a registered library's torch extension may not be loaded:
        then no model can contain the op, and it needs no rules)."""
        try:
            self.overload()
            return True
        except (AttributeError, RuntimeError):
            return False

    def translations(self, cfg: ExportConfig) -> dict[Any, Any]:
        from ._declared_export import translation
        if not self.loaded():
            return {}
        if cfg.lowering_for(self.OPS) == "custom":
            from ._declared_export import _user_translation

            return {self.overload(): _user_translation.get(self.op.qualname) or translation(self.op)}
        fn, opset = self._standard(cfg, dynamo=True)
        from ._build import DynamoBuilder

        sig = self.op.signature()

        def standard(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            return _call_standard(fn, self.op, DynamoBuilder(opset), [bound.arguments[a.name] for a in self.op.args])

        standard.__signature__ = sig  # type: ignore[attr-defined]
        return {self.overload(): standard}

    def symbolics(self, cfg: ExportConfig) -> dict[Any, Any]:
        from ._declared_export import _TS_DESC, symbolic
        if not self.loaded():
            return {}
        if cfg.lowering_for(self.OPS) == "custom":
            from ._declared_export import _user_symbolic

            return {self.op.qualname: _user_symbolic.get(self.op.qualname) or symbolic(self.op)}
        fn, _ = self._standard(cfg, dynamo=False)
        from torch.onnx import symbolic_helper as sh

        from ._build import TorchScriptBuilder

        sig = self.op.signature()
        op = self.op

        def standard(g: Any, *args: Any) -> Any:
            bound = sig.bind(*args)
            bound.apply_defaults()
            values = []
            for a in op.args:
                v = bound.arguments[a.name]
                if hasattr(a, "optional"):
                    values.append(None if v is None or sh._is_none(v) else v)
                elif hasattr(v, "node"):
                    values.append(None if sh._is_none(v) else sh._get_const(v, _TS_DESC[a.type], a.name))
                else:
                    values.append(v)
            y = _call_standard(fn, op, TorchScriptBuilder(g), values)
            if op.outputs[0].like >= 0:
                y.setType(values[op.outputs[0].like].type())
            return y

        return {self.op.qualname: standard}


def _modules() -> list[Any]:
    # This package's folder, read from this file's place (not from the package object, which
    # imports this module).
    mods = []
    for m in sorted(pkgutil.iter_modules([os.path.dirname(__file__)]), key=lambda m: m.name):
        if not m.name.startswith("_"):
            mods.append(importlib.import_module(f"opbridge.onnx.{m.name}"))
    return mods


# torch op name -> CustomOp (opbridge/onnx/_custom.py), in declaration order.
_declared_rules: dict[Any, Any] = {}


def add_declared_op(op: Any) -> None:  # a CustomOp (_custom imports this module)
    _declared_rules.pop(op.torch_op, None)
    _declared_rules[op.torch_op] = op


def declared_ops() -> list[OpDecl]:
    """Every op of every known library that has a torch namespace."""
    return [op for lib in libraries() if lib.namespace for op in lib.ops.values()]


def rule_sets() -> list[Any]:
    mods = _modules()  # also registers their standard lowerings
    names: dict[str, int] = {}
    for op in declared_ops():
        names[op.name] = names.get(op.name, 0) + 1
    rules: list[Any] = []
    for op in declared_ops():
        keys = (op.qualname, op.name) if names[op.name] == 1 else (op.qualname,)
        rules.append(DeclaredRules(op, keys))
    rules += [m.RULES for m in mods if hasattr(m, "RULES")]
    return rules + list(_declared_rules.values())


def op_names() -> set[str]:
    """Every ``lowering`` key."""
    return {name for r in rule_sets() for name in getattr(r, "OPS", ())}
