"""ONNX export of models that use opbridge ops, with either torch exporter.

* ``export(model, args, f, dynamo=True, ...)``: one call, both exporters, dynamic batch.
* ``translation_table()``: pass as ``custom_translation_table`` to ``torch.onnx.export(..., dynamo=True)``.
* ``register_symbolics()``: for ``torch.onnx.export(..., dynamo=False)`` (TorchScript exporter).
* ``declare_op(...)``: export rules for an op of your own (docs/cpp.md, "Writing your own op").
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import warnings
from typing import Any, Mapping

import onnx

from ._config import DOMAIN, DOMAIN_VERSION, LOWERINGS, ExportConfig, Lowering
from ._custom import CustomOp, declare_op
from ._registry import op_modules
from ._script import register_schemas

__all__ = [
    "CustomOp",
    "DOMAIN",
    "DOMAIN_VERSION",
    "LOWERINGS",
    "ExportConfig",
    "declare_op",
    "export",
    "register_schemas",
    "register_symbolics",
    "translation_table",
]


def _config(lowering: Lowering = "custom", custom_opsets: Mapping[str, int] | None = None,
            opset_version: int | None = None) -> ExportConfig:
    if isinstance(lowering, str) and lowering not in LOWERINGS:
        raise ValueError(f"lowering must be one of {LOWERINGS} or a mapping op -> lowering, got {lowering!r}")
    return ExportConfig(lowering=lowering, custom_opsets=dict(custom_opsets or {}), opset_version=opset_version)


def translation_table(lowering: Lowering = "custom", custom_opsets: Mapping[str, int] | None = None,
                      opset_version: int | None = None) -> dict:
    """``custom_translation_table`` for the dynamo exporter covering every opbridge op (and the
    torch ops opbridge lowers, such as torch.linalg.inv)."""
    import opbridge.ops  # noqa: F401  (the torch ops must exist)

    cfg = _config(lowering, custom_opsets, opset_version)
    table: dict = {}
    for mod in op_modules():
        if hasattr(mod, "translations"):
            table.update(mod.translations(cfg))
    return table


def register_symbolics(lowering: Lowering = "custom", custom_opsets: Mapping[str, int] | None = None,
                       opset_version: int | None = None) -> None:
    """Registers TorchScript-exporter symbolics for every opbridge op. Calling it again with
    another lowering replaces the previous registration."""
    import torch

    import opbridge.ops  # noqa: F401

    cfg = _config(lowering, custom_opsets, opset_version)
    for mod in op_modules():
        if not hasattr(mod, "symbolics"):
            continue
        for name, fn in mod.symbolics(cfg).items():
            # Opset 1 makes the symbolic apply to every default-domain opset.
            torch.onnx.register_custom_op_symbolic(name, fn, 1)


def _tensor_args(args: Any) -> tuple:
    if not isinstance(args, tuple):
        args = (args,)
    return args


def _input_names(model: Any, args: tuple) -> list[str]:
    try:
        params = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError, AttributeError):
        params = []
    names = [p.name for p in params[: len(args)]]
    names += [f"input_{i}" for i in range(len(names), len(args))]
    return names


@contextlib.contextmanager
def _quiet_exporter():
    """Silences exporter chatter that says nothing about the user's model: the dynamo exporter
    logs one warning per torchvision op when torchvision is absent, torch's pytree emits a
    FutureWarning, and the TorchScript exporter warns that it is deprecated (it is the exporter
    the caller chose with dynamo=False)."""
    log = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
            warnings.filterwarnings("ignore", message=r".*legacy TorchScript-based ONNX export.*")
            warnings.filterwarnings("ignore", message=r"The feature will be removed.*", category=DeprecationWarning)
            yield
    finally:
        log.setLevel(level)


def export(
    model: Any,
    args: Any,
    f: str | os.PathLike | None = None,
    *,
    dynamo: bool = True,
    opset_version: int | None = None,
    lowering: Lowering = "custom",
    custom_opsets: Mapping[str, int] | None = None,
    dynamic_batch: bool = True,
    **kwargs: Any,
) -> onnx.ModelProto:
    """Exports ``model(*args)`` to ONNX, lowering opbridge ops (and torch ops opbridge knows,
    e.g. torch.linalg.inv) as chosen by ``lowering``. Returns the ModelProto and, when ``f`` is
    given, writes it there.

    dynamo: True for the dynamo exporter (torch.export + onnxscript), False for the TorchScript
        exporter.
    lowering: "custom" (``ai.opbridge`` nodes; run with opbridge's ORT library) or "standard"
        (stock ONNX Runtime), or a mapping op name -> lowering.
    custom_opsets: opset version per custom domain, e.g. {"com.microsoft": 1}.
    dynamic_batch: make dim 0 of every tensor input dynamic unless the caller passes
        ``dynamic_shapes`` (dynamo) or ``dynamic_axes`` (either exporter) itself.
    kwargs: passed to ``torch.onnx.export`` (input_names, output_names, dynamic_shapes, ...).
    """
    import torch

    cfg = _config(lowering, custom_opsets, opset_version)
    args = _tensor_args(args)
    tensor_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    user_dynamic = "dynamic_shapes" in kwargs or "dynamic_axes" in kwargs
    register_schemas()

    if dynamo:
        table = dict(translation_table(cfg.lowering, cfg.custom_opsets, cfg.opset_version))
        table.update(kwargs.pop("custom_translation_table", None) or {})
        if dynamic_batch and not user_dynamic:
            batch = torch.export.Dim("batch")
            kwargs["dynamic_shapes"] = tuple(
                {0: batch} if i in tensor_positions and args[i].dim() > 0 else None for i in range(len(args))
            )
        kwargs.setdefault("verbose", False)
        with _quiet_exporter():
            program = torch.onnx.export(
                model, args, dynamo=True, opset_version=opset_version, custom_translation_table=table, **kwargs
            )
        proto = program.model_proto
    else:
        register_symbolics(cfg.lowering, cfg.custom_opsets, cfg.opset_version)
        names = kwargs.pop("input_names", None) or _input_names(model, args)
        if dynamic_batch and not user_dynamic:
            kwargs["dynamic_axes"] = {names[i]: {0: "batch"} for i in tensor_positions if args[i].dim() > 0}
        opsets = {DOMAIN: DOMAIN_VERSION}
        opsets.update(cfg.custom_opsets)
        opsets.update(kwargs.pop("custom_opsets", None) or {})
        import io

        buf = io.BytesIO()
        with _quiet_exporter():
            torch.onnx.export(
                model, args, buf, dynamo=False, opset_version=opset_version or 17, input_names=names,
                custom_opsets=opsets, **kwargs,
            )
        proto = onnx.load_from_string(buf.getvalue())
    if f is not None:
        onnx.save(proto, os.fspath(f))
    return proto
