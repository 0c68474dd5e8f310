"""``opbridge.onnx.export``: one call for both torch exporters, and what follows them: the
dynamic batch, GroupNorm fusion, tensors to external data, opset conversion and the fix-ups that
make the model self-describing (typed custom outputs, only the domains used, the lowest IR)."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import warnings
from typing import TYPE_CHECKING, Any, Iterator, Mapping, cast

import onnx

from . import _dynamic
from . import _external_data
from .._library import DOMAIN
from ._config import ExportConfig, Lowering, default_opset
from ._exporter_rules import _config, symbolics_registered, translation_table
from ._nodes import graph_nodes
from ._registry import new_export
from ._script import infer_shapes

if TYPE_CHECKING:  # torch only where an export needs it
    import torch

__all__ = ["export"]


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
    the caller chose with dynamo=False). A fake kernel's refusal of the model's arguments is logged
    by torch with its whole traceback before the export fails with it: the error says it (see
    ``_model_error``)."""
    quiet = {"torch.onnx._internal.exporter._registration": logging.ERROR,
             "torch._subclasses.fake_tensor": logging.CRITICAL}
    logs = {logging.getLogger(name): level for name, level in quiet.items()}
    saved = {log: log.level for log in logs}
    for log, level in logs.items():
        log.setLevel(level)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
            warnings.filterwarnings("ignore", message=r".*legacy TorchScript-based ONNX export.*")
            warnings.filterwarnings("ignore", message=r"The feature will be removed.*", category=DeprecationWarning)
            yield
    finally:
        for log, level in saved.items():
            log.setLevel(level)


def _model_error(e: BaseException) -> BaseException | None:
    """The error of an op's argument check (``opbridge::group_norm: x must have rank >= 2 ...``)
    that made ``torch.export`` fail, or None: the model calls the op with arguments it refuses, and
    the dynamo exporter says so in the same words (and type) as the TorchScript one and eager torch."""
    from .._declarations import CheckError

    seen = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        # The op's adapter raises the check's verdict `from None`: the CheckError is its context.
        if isinstance(cur.__cause__ or cur.__context__, CheckError) and isinstance(cur, (ValueError, TypeError)):
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


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
            try:
                with _quiet_exporter(), dyn.quiet():
                    program = torch.onnx.export(
                        model, args, dynamo=True, opset_version=max(opset, _DYNAMO_MIN_OPSET),
                        custom_translation_table=table, **kwargs,
                    )
            except Exception as e:
                refused = _model_error(e)
                if refused is None:
                    raise
                raise type(refused)(str(refused)) from e
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
        from ._rewrite import EXPORT_SOURCES, rewrite_model

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
            from ._rewrite import fuse_exported

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
            from ._rewrite import infer_shapes_ir

            infer_shapes_ir(model)
            return


def _convert_opset(proto: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    from onnx import version_converter

    has_default = any(n.domain in ("", "ai.onnx") for n in graph_nodes(proto.graph))
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
    for node in graph_nodes(graph):
        if node.domain in ("", "ai.onnx") and node.op_type in _REDUCE18:
            keep = [a for a in node.attribute if not (a.name == "noop_with_empty_axes" and a.i == 0)]
            if len(keep) != len(node.attribute):
                del node.attribute[:]
                node.attribute.extend(keep)


# Element types IR 9 does not know (UINT4 = 21 and later, IR 10+).
_IR9_MAX_ELEM_TYPE = onnx.TensorProto.FLOAT8E5M2FNUZ


def _finalize(proto: onnx.ModelProto, cfg: ExportConfig | None = None) -> None:
    """Post-export fix-ups shared by both exporters (see export's docstring)."""
    from ._declared_export import stamp_versions

    stamp_versions(proto, dict(cfg.custom_opsets) if cfg is not None else {}, graph_nodes(proto.graph))
    used = {n.domain for n in graph_nodes(proto.graph)}
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
    for node in graph_nodes(graph):
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
