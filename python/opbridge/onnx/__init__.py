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

import contextlib
import inspect
import logging
import os
import warnings
from typing import Any, Mapping

import onnx

from ._config import DOMAIN, DOMAIN_VERSION, LOWERINGS, ExportConfig, Lowering, default_opset
from ._custom import CustomOp, declare_op
from ._registry import op_modules, op_names
from ._script import infer_shapes, register_schemas

__all__ = [
    "CustomOp",
    "DOMAIN",
    "DOMAIN_VERSION",
    "LOWERINGS",
    "ExportConfig",
    "declare_op",
    "export",
    "infer_shapes",
    "register_schemas",
    "register_symbolics",
    "translation_table",
]

register_schemas()


def _config(lowering: Lowering = None, custom_opsets: Mapping[str, int] | None = None,
            opset_version: int | None = None) -> ExportConfig:
    if isinstance(lowering, str):
        if lowering not in LOWERINGS:
            raise ValueError(f"lowering must be one of {LOWERINGS}, a mapping op -> lowering or None, got {lowering!r}")
    elif lowering is not None:
        known = op_names()
        for op, value in dict(lowering).items():
            if op not in known:
                raise ValueError(f"lowering: unknown op {op!r}; opbridge ops are {sorted(known)}")
            if value not in LOWERINGS:
                raise ValueError(f"lowering for {op!r} must be one of {LOWERINGS}, got {value!r}")
    return ExportConfig(lowering=lowering, custom_opsets=dict(custom_opsets or {}), opset_version=opset_version)


def translation_table(lowering: Lowering = None, custom_opsets: Mapping[str, int] | None = None,
                      opset_version: int | None = None) -> dict:
    """``custom_translation_table`` for the dynamo exporter covering every opbridge op (and the
    torch ops opbridge lowers, such as torch.linalg.inv). Arguments as for ``export``; pass the
    ``opset_version`` you give torch.onnx.export (None: torch's default): standard lowerings depend on it."""
    import opbridge.ops  # noqa: F401  (the torch ops must exist)

    cfg = _config(lowering, custom_opsets, opset_version)
    table: dict = {}
    for mod in op_modules():
        if hasattr(mod, "translations"):
            table.update(_rules(mod.translations, cfg))
    return table


def _rules(make: Any, cfg: ExportConfig) -> dict:
    """make(cfg) (an op module's translations or symbolics). When the module has no such
    lowering (NotImplementedError, e.g. lowering="standard" for an op without a standard form),
    its rules raise that error when used, so that models without that op still export."""
    import functools

    try:
        return make(cfg)
    except NotImplementedError as err:
        error = err  # `err` itself is unbound when the except clause ends
        defaults = ExportConfig(custom_opsets=cfg.custom_opsets, opset_version=cfg.opset_version)

        def unavailable(fn: Any) -> Any:
            @functools.wraps(fn)  # keeps the signature, which the exporters inspect
            def rule(*args: Any, **kwargs: Any) -> Any:
                raise NotImplementedError(str(error)) from error

            return rule

        return {key: unavailable(fn) for key, fn in make(defaults).items()}


def register_symbolics(lowering: Lowering = None, custom_opsets: Mapping[str, int] | None = None,
                       opset_version: int | None = None) -> None:
    """Registers TorchScript-exporter symbolics for every opbridge op (and the torch ops opbridge
    lowers, such as torch.linalg.inv). Calling it again with another lowering replaces the
    previous registration. Pass the same ``custom_opsets`` to ``torch.onnx.export``."""
    import torch

    import opbridge.ops  # noqa: F401

    cfg = _config(lowering, custom_opsets, opset_version)
    for mod in op_modules():
        if not hasattr(mod, "symbolics"):
            continue
        for name, fn in _rules(mod.symbolics, cfg).items():
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


# The dynamo exporter builds graphs at opset >= 18 (torchlib) and converts down. torch 2.13 does
# that conversion itself, but raises when a graph has no default-domain node left (only ai.opbridge
# nodes); for opsets below 18 opbridge therefore exports at 18 and converts with onnx's converter.
_DYNAMO_MIN_OPSET = 18


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
    lowering: Lowering = None,
    custom_opsets: Mapping[str, int] | None = None,
    dynamic_batch: bool = True,
    **kwargs: Any,
) -> onnx.ModelProto:
    """Exports ``model(*args)`` to ONNX, lowering opbridge ops (and torch ops opbridge knows,
    e.g. torch.linalg.inv) as chosen by ``lowering``. Returns the ModelProto and, when ``f`` is
    given, writes it there.

    dynamo: True for the dynamo exporter (torch.export + onnxscript), False for the TorchScript
        exporter (opsets <= 20).
    opset_version: default-domain opset; None: 20 (dynamo, torch's default) or 17 (TorchScript).
    lowering: "custom" (``ai.opbridge`` nodes; run with opbridge's ORT library) or "standard"
        (stock ONNX Runtime) for every op, or a mapping op name -> lowering (e.g.
        ``{"torch_inverse": "custom"}``), or None: each op its own default ("custom" for
        opbridge's ops; "standard", i.e. ``com.microsoft::Inverse``, for torch.inverse /
        torch.linalg.inv).
    custom_opsets: opset version per custom domain, e.g. {"com.microsoft": 1}; the model imports
        each domain it uses at that version (default 1).
    dynamic_batch: make dim 0 of every tensor input dynamic unless the caller passes
        ``dynamic_shapes`` (dynamo) or ``dynamic_axes`` (either exporter) itself.
    kwargs: passed to ``torch.onnx.export`` (input_names, output_names, dynamic_shapes, ...).

    The model is self-describing and as portable as its opset allows: every ``ai.opbridge`` node
    output carries its type and shape, custom domains no node uses are not imported, and the IR
    version is the lowest the opset needs (IR 9 up to opset 20, so ONNX Runtime 1.17 loads it).
    """
    import torch

    opset = int(opset_version) if opset_version is not None else default_opset(dynamo)
    cfg = _config(lowering, custom_opsets, opset)
    args = _tensor_args(args)
    tensor_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    user_dynamic = "dynamic_shapes" in kwargs or "dynamic_axes" in kwargs

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
                model, args, dynamo=True, opset_version=max(opset, _DYNAMO_MIN_OPSET), custom_translation_table=table,
                **kwargs,
            )
        proto = program.model_proto
        # The exporter stamps custom domains with their schemas' versions; honour the request.
        for imp in proto.opset_import:
            if imp.domain and imp.domain in cfg.custom_opsets:
                imp.version = int(cfg.custom_opsets[imp.domain])
        if opset < _DYNAMO_MIN_OPSET:
            proto = _convert_opset(proto, opset)
    else:
        register_symbolics(cfg.lowering, cfg.custom_opsets, cfg.opset_version)
        names = kwargs.pop("input_names", None) or _input_names(model, args)
        if dynamic_batch and not user_dynamic:
            kwargs["dynamic_axes"] = {names[i]: {0: "batch"} for i in tensor_positions if args[i].dim() > 0}
        # Domains not listed are imported at version 1 (= DOMAIN_VERSION), and only if used.
        opsets = dict(cfg.custom_opsets)
        opsets.update(kwargs.pop("custom_opsets", None) or {})
        import io

        buf = io.BytesIO()
        with _quiet_exporter():
            torch.onnx.export(
                model, args, buf, dynamo=False, opset_version=opset, input_names=names,
                custom_opsets=opsets, **kwargs,
            )
        proto = onnx.load_from_string(buf.getvalue())
    _stamp_domain_version(proto, cfg)
    _finalize(proto)
    if f is not None:
        onnx.save(proto, os.fspath(f))
    return proto


def _first_versions() -> dict[str, int]:
    """op type -> the ai.opbridge version that introduced it (from the registered schemas)."""
    register_schemas()
    first: dict[str, int] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain == DOMAIN:
            first[schema.name] = min(first.get(schema.name, schema.since_version), schema.since_version)
    return first


def _stamp_domain_version(proto: onnx.ModelProto, cfg: ExportConfig) -> None:
    """Imports ai.opbridge at least at the version its newest op needs (MultiScaleDeformableAttention
    exists since version 2; the TorchScript exporter imports every custom domain at 1). A version
    the caller asked for explicitly (custom_opsets) is never raised: asking for one that lacks an
    op the model uses is an error."""
    used = {n.op_type for n in _all_nodes(proto.graph) if n.domain == DOMAIN}
    if not used:
        return
    first = _first_versions()
    need = max(first.get(op, DOMAIN_VERSION) for op in used)
    for imp in proto.opset_import:
        if imp.domain != DOMAIN or imp.version >= need:
            continue
        if DOMAIN in cfg.custom_opsets:
            newer = sorted(op for op in used if first.get(op, DOMAIN_VERSION) > imp.version)
            raise ValueError(f"custom_opsets asks for {DOMAIN} version {imp.version}, but the model uses "
                             f"{', '.join(newer)}, which {DOMAIN} has only since version {need}")
        imp.version = need


def _convert_opset(proto: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    from onnx import version_converter

    has_default = any(n.domain in ("", "ai.onnx") for n in _all_nodes(proto.graph))
    if has_default:
        proto = version_converter.convert_version(proto, opset)
        if opset < 18:
            _drop_reduce18_attributes(proto.graph)
        return proto
    # Nothing to convert: only restate the default-domain import.
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = opset
    return proto


# Reductions that gained noop_with_empty_axes (and axes as an input) in opset 18.
_REDUCE18 = {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
             "ReduceLogSumExp", "ReduceSumSquare"}


def _drop_reduce18_attributes(graph: onnx.GraphProto) -> None:
    """onnx's 18 -> 17 converter moves these reductions' axes into the attribute but keeps the
    opset-18-only noop_with_empty_axes, which makes the model invalid; at its default (0) it
    means exactly what opset 17 does, so it goes."""
    for node in _all_nodes(graph):
        if node.domain in ("", "ai.onnx") and node.op_type in _REDUCE18:
            keep = [a for a in node.attribute if not (a.name == "noop_with_empty_axes" and a.i == 0)]
            if len(keep) != len(node.attribute):
                del node.attribute[:]
                node.attribute.extend(keep)


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _all_nodes(g)


# Element types IR 9 does not know (UINT4 = 21 and later, IR 10+).
_IR9_MAX_ELEM_TYPE = onnx.TensorProto.FLOAT8E5M2FNUZ


def _finalize(proto: onnx.ModelProto) -> None:
    """Post-export fix-ups shared by both exporters (see export's docstring)."""
    used = {n.domain for n in _all_nodes(proto.graph)}
    for fn in proto.functions:
        used |= {n.domain for n in fn.node} | {fn.domain}
    keep = [imp for imp in proto.opset_import if imp.domain in ("", "ai.onnx") or imp.domain in used]
    if len(keep) != len(proto.opset_import):
        del proto.opset_import[:]
        proto.opset_import.extend(keep)

    # Lowest IR version the opsets allow, unless the model uses what only a newer IR has.
    max_type = _max_elem_type(proto.graph)
    if not proto.functions and max_type <= _IR9_MAX_ELEM_TYPE:
        needed = onnx.helper.find_min_ir_version_for(list(proto.opset_import), ignore_unknown=True)
        # Never below IR 7 (opsets < 12): older IRs read initializers and graph inputs differently.
        needed = max(needed, 7)
        if max_type >= onnx.TensorProto.FLOAT8E4M3FN:  # float8 types arrived with IR 9
            needed = max(needed, 9)
        proto.ir_version = min(proto.ir_version, needed)

    _ensure_custom_output_types(proto)


def _max_elem_type(graph: onnx.GraphProto) -> int:
    """Largest element type number the graph mentions (values, initializers, Constant/Cast)."""
    types = [vi.type.tensor_type.elem_type for vi in (*graph.input, *graph.output, *graph.value_info)]
    types += [t.data_type for t in graph.initializer]
    for node in _all_nodes(graph):
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                types.append(a.t.data_type)
            elif a.name == "to" and a.type == onnx.AttributeProto.INT:
                types.append(a.i)
    return max(types, default=0)


def _ensure_custom_output_types(proto: onnx.ModelProto) -> None:
    """Every ai.opbridge node output gets a type and shape in the graph (value_info or output)."""
    typed = {vi.name for vi in (*proto.graph.value_info, *proto.graph.output) if vi.type.tensor_type.HasField("shape")}
    missing = [o for n in proto.graph.node if n.domain == DOMAIN for o in n.output if o and o not in typed]
    if missing:
        inferred = infer_shapes(proto)
        del proto.graph.value_info[:]
        proto.graph.value_info.extend(inferred.graph.value_info)
