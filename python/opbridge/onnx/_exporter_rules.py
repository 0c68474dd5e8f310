"""The rule tables opbridge hands torch's exporters: the dynamo exporter's
``custom_translation_table`` and the TorchScript exporter's symbolics, built from every rule set
(_registry.py) for one export configuration. Needs torch only when a table is built."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping

from ._config import LOWERINGS, ExportConfig, Lowering
from ._registry import op_names, rule_sets

__all__ = ["register_symbolics", "symbolics_registered", "translation_table"]


def _config(lowering: Lowering = None, custom_opsets: Mapping[str, int] | None = None,
            opset_version: int | None = None) -> ExportConfig:
    if isinstance(lowering, str):
        if lowering not in LOWERINGS:
            raise ValueError(f"lowering must be one of {LOWERINGS}, a mapping op -> lowering or None, got {lowering!r}")
    elif lowering is not None:
        known = op_names()
        for op, value in dict(lowering).items():
            if op not in known:
                raise ValueError(f"lowering: unknown op {op!r}; the lowering keys are {sorted(known)}")
            if value not in LOWERINGS:
                raise ValueError(f"lowering for {op!r} must be one of {LOWERINGS}, got {value!r}")
    return ExportConfig(lowering=lowering, custom_opsets=dict(custom_opsets or {}), opset_version=opset_version)


def translation_table(lowering: Lowering = None, custom_opsets: Mapping[str, int] | None = None,
                      opset_version: int | None = None) -> dict[Callable[..., Any], Callable[..., Any]]:
    """``custom_translation_table`` for the dynamo exporter covering every op opbridge knows at
    this moment (its own, registered libraries', declare_op's, and the torch ops opbridge lowers,
    such as torch.linalg.inv). Arguments as for ``export``; pass the ``opset_version`` you give
    torch.onnx.export (None: torch's default): standard lowerings depend on it."""
    import opbridge.ops  # noqa: F401  (the torch ops must exist)

    cfg = _config(lowering, custom_opsets, opset_version)
    table: dict[Any, Any] = {}
    for rules in rule_sets():
        if hasattr(rules, "translations"):
            table.update(_rules(rules.translations, cfg))
    return table


def _rules(make: Callable[[ExportConfig], dict[Any, Any]], cfg: ExportConfig) -> dict[Any, Any]:
    """make(cfg) (a rule set's translations or symbolics). When the op has no such lowering
    (NotImplementedError, e.g. lowering="standard" for an op without a standard form), its rules
    raise that error when used, so that models without that op still export, and a model with it
    fails with a message naming the op (never a silent custom node)."""
    import functools

    try:
        return make(cfg)
    except NotImplementedError as err:
        error = err  # `err` itself is unbound when the except clause ends
        defaults = ExportConfig(lowering="custom", custom_opsets=cfg.custom_opsets, opset_version=cfg.opset_version)

        def unavailable(fn: Any) -> Any:
            @functools.wraps(fn)  # keeps the signature, which the exporters inspect
            def rule(*args: Any, **kwargs: Any) -> Any:
                raise NotImplementedError(str(error)) from error

            return rule

        return {key: unavailable(fn) for key, fn in make(defaults).items()}


def _symbolics(cfg: ExportConfig) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for rules in rule_sets():
        if hasattr(rules, "symbolics"):
            out.update(_rules(rules.symbolics, cfg))
    return out


def register_symbolics(lowering: Lowering = None, custom_opsets: Mapping[str, int] | None = None,
                       opset_version: int | None = None) -> None:
    """Registers TorchScript-exporter symbolics for every op opbridge knows (and the torch ops it
    lowers, such as torch.linalg.inv) with torch, persistently: for calling
    ``torch.onnx.export(..., dynamo=False)`` yourself. ``opbridge.onnx.export`` does not need it
    and leaves torch as it found it; use :func:`symbolics_registered` for a scoped registration.
    Calling it again with another lowering replaces the previous registration. Pass the same
    ``custom_opsets`` to ``torch.onnx.export``."""
    import torch

    import opbridge.ops  # noqa: F401

    for name, fn in _symbolics(_config(lowering, custom_opsets, opset_version)).items():
        # Opset 1 makes the symbolic apply to every default-domain opset.
        torch.onnx.register_custom_op_symbolic(name, fn, 1)  # type: ignore[attr-defined]


@contextlib.contextmanager
def symbolics_registered(lowering: Lowering = None, custom_opsets: Mapping[str, int] | None = None,
                         opset_version: int | None = None) -> Iterator[None]:
    """Within the ``with`` block, the TorchScript exporter has opbridge's symbolics; afterwards
    the exporter's registry is exactly as before (symbolics registered by anyone else for the same
    ops, before, are back in place)."""
    import torch

    import opbridge.ops  # noqa: F401

    registry = _torchscript_registry()
    table = _symbolics(_config(lowering, custom_opsets, opset_version))
    saved = {}
    for name in table:
        group = registry.get_function_group(name)
        saved[name] = None if group is None else dict(group._functions._overrides)
    try:
        for name, fn in table.items():
            torch.onnx.register_custom_op_symbolic(name, fn, 1)  # type: ignore[attr-defined]
        yield
    finally:
        for name, before in saved.items():
            if before is None:
                registry._registry.pop(name, None)
                continue
            functions = registry.get_function_group(name)._functions
            if 1 in before:
                functions.override(1, before[1])
            else:
                functions.remove_override(1)


def _torchscript_registry() -> Any:
    try:  # torch >= 2.9 keeps the TorchScript exporter's registry here
        from torch.onnx._internal.torchscript_exporter.registration import registry
    except ImportError:  # pragma: no cover - older torch
        from torch.onnx._internal.registration import registry  # type: ignore[import-not-found,no-redef]
    return registry
