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
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, cast

import onnx

from .._decl import on_register as _decl_on_register
from .._library import DOMAIN
from . import _dynamic
from . import _external_data
from ._build import Builder
from ._config import DOMAIN_VERSION, LOWERINGS, ExportConfig, Lowering, default_opset
from ._custom import CustomOp, declare_op
from ._declared import register_shape_inference, register_symbolic, register_translation
from ._registry import new_export, op_names, rule_sets, standard_lowering
from ._script import infer_shapes, register_schemas

if TYPE_CHECKING:  # torch only where an export needs it
    import torch

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
_decl_on_register(lambda _library: register_schemas())


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


def check_attributes(model: onnx.ModelProto | str | os.PathLike[str]) -> list[str]:
    """Problems ONNX Runtime cannot see in a model's declared-op nodes: unknown (e.g. misspelled)
    attribute names and attributes newer than the op version the model imports. ``model``: a
    ModelProto or a path. Empty when there are none. opbridge.InferenceSession and `opbridge
    check` run it; onnx.checker finds unknown attributes through our OpSchemas too."""
    from . import _reader
    from ._declared import attribute_problems

    if not isinstance(model, onnx.ModelProto):
        path, model = model, _reader.read_graph(model)
        _reader.check(model, path)
    return attribute_problems(model)


def _tensor_args(args: Any) -> tuple[Any, ...]:
    if not isinstance(args, tuple):
        args = (args,)
    return cast("tuple[Any, ...]", args)


def _var_positional_start(model: Any, args: tuple[Any, ...]) -> int | None:
    """The position of forward's *args parameter among the inputs, or None where it has none."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError, AttributeError):
        return None
    k = next((i for i, p in enumerate(params) if p.kind == p.VAR_POSITIONAL), None)
    return k if k is not None and k <= len(args) else None


def _input_names(model: Any, args: tuple[Any, ...]) -> list[str]:
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
def _quiet_exporter() -> Iterator[None]:
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
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: torch.Tensor | tuple[Any, ...],
    f: str | os.PathLike[str] | None = None,
    *,
    dynamo: bool = True,
    opset_version: int | None = None,
    lowering: Lowering = None,
    custom_opsets: Mapping[str, int] | None = None,
    dynamic_batch: bool = True,
    fuse: bool = True,
    external_data: bool | None = None,
    **kwargs: Any,
) -> onnx.ModelProto:
    """Exports ``model(*args)`` to ONNX, lowering opbridge ops (and torch ops opbridge knows,
    e.g. torch.linalg.inv) as chosen by ``lowering``. Returns the ModelProto and, when ``f`` is
    given, writes it there (under a temporary name, renamed when complete). With external data
    the returned ModelProto is the one in ``f``: the graph, and for each large tensor its location,
    offset and length in ``<f>.data`` instead of the tensor (``onnx.load(f)`` loads both).

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
    dynamic_batch: make the batch dynamic unless the caller passes ``dynamic_shapes`` (dynamo) or
        ``dynamic_axes`` itself: dim 0 of the first tensor input and of every tensor input whose
        dim 0 has that same example size becomes one dynamic dim named "batch"; other inputs (a
        weight of another length) stay static, and so, with a warning, does a parameter-like input
        (nn.Parameter, requires_grad, or named weight/bias/scale/...) whose length merely equals
        the batch. The caller's own dynamic shapes are checked against the example inputs first
        (opbridge/onnx/_dynamic.py).
    fuse: when GroupNorm's lowering is "custom", every GroupNorm the exporter wrote as standard ONNX
        (torch.nn.GroupNorm / F.group_norm: its Reshape/InstanceNormalization decomposition or
        GroupNormalization-21) becomes ``ai.opbridge::GroupNorm``, and a GroupNorm followed by SiLU
        (F.silu, nn.SiLU, x * sigmoid(x)) whose output nothing else reads becomes one node with
        ``activation="silu"`` (docs/optimize.md lists the exact patterns). False: as exported.
    external_data: True: tensors over 1 KiB go to ``<f>.data`` beside ``f``; False: all in ``f``
        (up to protobuf's 2 GB limit; writing one file serializes the model in memory, about twice
        its size); None (default): external when the model's tensors pass 256 MiB
        (``opbridge.onnx._external_data.AUTO_EXTERNAL_BYTES``), as torch.onnx.export writes them. External
        tensors are written one at a time, straight from the exported model (torch's own memory
        with the dynamo exporter): export then needs no more memory than torch.onnx.export itself
        (docs/optimize.md, "Real-size models").
    kwargs: passed to ``torch.onnx.export`` (input_names, output_names, dynamic_shapes, ...).

    The model is self-describing and as portable as its opset allows: every ``ai.opbridge`` node
    output carries its type and shape, custom domains no node uses are not imported, and the IR
    version is the lowest the opset needs (IR 9 up to opset 20, so ONNX Runtime 1.17 loads it).
    """
    import torch

    opset = int(opset_version) if opset_version is not None else default_opset(dynamo)
    cfg = _config(lowering, custom_opsets, opset)
    new_export()
    args = _tensor_args(args)
    if f is not None:
        f = os.fspath(f)
    elif external_data:
        raise ValueError("external_data=True needs a file name f to write the data beside")

    # Refused before torch starts when the machine cannot hold it, not killed midway.
    state = _external_data.state_bytes(model)
    if f is None:
        writes = "in_memory"
    else:
        writes = "external" if _external_data.wants_external(external_data, state) else "one_file"
    _external_data.check_export_memory(state, dynamo, writes)

    with contextlib.ExitStack() as stack:
        if dynamo:
            table = dict(translation_table(cfg.lowering, cfg.custom_opsets, cfg.opset_version))
            table.update(kwargs.pop("custom_translation_table", None) or {})
            dyn = _dynamic.plan(args, _input_names(model, args), kwargs, dynamo=True, dynamic_batch=dynamic_batch)
            kwargs.update(_dynamic.group_var_positional(dyn.kwargs, _var_positional_start(model, args)))
            dyn.warn()
            kwargs.setdefault("verbose", False)
            with _quiet_exporter(), dyn.quiet():
                program = torch.onnx.export(
                    model, args, dynamo=True, opset_version=max(opset, _DYNAMO_MIN_OPSET),
                    custom_translation_table=table, **kwargs,
                )
            # The exported model as onnx_ir holds torch's own tensors: nothing is copied until
            # the tensors are written.
            ir_model = cast("torch.onnx.ONNXProgram", program).model
            del program
            external = f is not None and _external_data.wants_external(
                external_data, _external_data.tensor_bytes(ir_model))
            # The exporter stamps custom domains with their schemas' versions; honour the request
            # (declared ops' domains are stamped by _finalize, from the nodes).
            for domain in list(ir_model.opset_imports):
                if domain and domain in cfg.custom_opsets:
                    ir_model.opset_imports[domain] = int(cfg.custom_opsets[domain])
        else:
            names = kwargs.pop("input_names", None) or _input_names(model, args)
            dyn = _dynamic.plan(args, names, kwargs, dynamo=False, dynamic_batch=dynamic_batch)
            kwargs.update(dyn.kwargs)
            dyn.warn()
            # Domains not listed are imported at version 1 (= DOMAIN_VERSION), and only if used.
            opsets = dict(cfg.custom_opsets)
            opsets.update(kwargs.pop("custom_opsets", None) or {})

            def export_to(target: Any) -> None:
                with _quiet_exporter(), symbolics_registered(cfg.lowering, cfg.custom_opsets, cfg.opset_version):
                    torch.onnx.export(
                        model, args, target, dynamo=False, opset_version=opset, input_names=names,
                        custom_opsets=opsets, **kwargs,
                    )

            # Decided before exporting, from the module's state: the exporter serializes into
            # memory (one file) or to a folder (external data). Without a file, only protobuf's
            # limit counts (past it torchscript_model asks for a file).
            external = (_external_data.wants_external(external_data, state) if f is not None
                        else state > _external_data.IN_MEMORY_LIMIT)
            ir_model = _external_data.torchscript_model(export_to, f, external, stack)
        return _write(ir_model, f, external, cfg, fuse=fuse, convert=dynamo and opset < _DYNAMO_MIN_OPSET,
                      external_data=external_data)


def _write(model: Any, f: str | None, external: bool, cfg: ExportConfig, *, fuse: bool, convert: bool,
           external_data: bool | None) -> onnx.ModelProto:
    """The common end of both exporters: fusion, tensors to ``<f>.data`` (when ``external``),
    opset conversion (``convert``: the dynamo exporter wrote opset 18, lower was asked for),
    fix-ups, and the file. ``model`` is an onnx_ir Model; the ModelProto is made once, after the
    tensors went to disk, so that it refers to them instead of copying them."""
    import onnx_ir as ir

    fuse = fuse and cfg.lowering_for(("opbridge::group_norm", "group_norm")) == "custom"
    if fuse and not convert:
        # On the exporter's model, before any copy (the rules read small constants only).
        from ._fusion import EXPORT_SOURCES, rewrite_model

        rewrite_model(model, sources=EXPORT_SOURCES)
        fuse = False
    if external:
        _external_data.unload(model, cast("str | os.PathLike[str]", f))  # external: f is given
    _type_custom_outputs(model)
    proto = ir.serde.serialize_model(model)
    if convert:
        # onnx's converter works on a ModelProto (small by now when the tensors are external);
        # the fusion follows it, as it matches the converted opset's forms.
        proto = _convert_opset(proto, cast(int, cfg.opset_version))  # convert: an opset was asked for
        if fuse:
            from ._fusion import fuse_exported

            proto = fuse_exported(proto, path=f)
    _finalize(proto, cfg)
    if f is not None:
        _external_data.save(proto, f, external_data)
    return proto


def _type_custom_outputs(model: Any) -> None:
    """Types and shapes for ai.opbridge node outputs that have none, inferred on the onnx_ir model
    (which leaves large tensors out of onnx's inference; _finalize's check on the ModelProto then
    finds nothing to do)."""
    for node in model.graph:
        if node.domain == DOMAIN and any(o.shape is None or o.dtype is None for o in node.outputs):
            from ._fusion import infer_shapes_ir

            infer_shapes_ir(model)
            return


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


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
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


def _finalize(proto: onnx.ModelProto, cfg: ExportConfig | None = None) -> None:
    """Post-export fix-ups shared by both exporters (see export's docstring)."""
    from ._declared import stamp_versions

    stamp_versions(proto, dict(cfg.custom_opsets) if cfg is not None else {}, _all_nodes(proto.graph))
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
