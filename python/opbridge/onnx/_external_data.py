"""Models past protobuf's 2 GB limit in ``opbridge.onnx.export``: tensors in an external data file.

A ModelProto is one protobuf message and cannot be serialized past 2 GiB. With external data the
model file holds the graph and each large tensor's (location, offset, length) in ``<f>.data``
beside it; ONNX Runtime, ``onnx.load`` and ``opbridge check``/``optimize`` read that file from
the model's folder.

``export`` writes external data when asked (``external_data=True``) or, by default, when the
model's tensors would not fit in one message. The tensors then go to disk straight from the
exporter's model (no copy of the whole model in memory) and the ModelProto that ``export``
returns refers to the data file instead of holding the tensors.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Callable

import onnx

from .._optimize import EXTERNAL_ALIGNMENT, EXTERNAL_THRESHOLD, PROTOBUF_LIMIT, data_file_name, tensor_bytes

# Past this many tensor bytes the model goes external by default: the limit less room for the
# graph itself (nodes, names, shapes), which a large model's tensors dwarf.
AUTO_EXTERNAL_BYTES = PROTOBUF_LIMIT - (64 << 20)


def wants_external(external_data: bool | None, nbytes: int) -> bool:
    """external_data as the caller gave it (True/False), or None: only when needed."""
    if external_data is not None and not isinstance(external_data, bool):
        raise TypeError(f"external_data must be True, False or None (automatic), got {external_data!r}")
    return bool(external_data) if external_data is not None else nbytes > AUTO_EXTERNAL_BYTES


def _unload(model: Any, f: str | os.PathLike) -> None:
    """Moves ``model``'s (an onnx_ir Model) initializers into ``<f>.data`` beside ``f``."""
    import onnx_ir as ir

    f = os.path.abspath(os.fspath(f))
    ir.external_data.unload_from_model(model, os.path.dirname(f), data_file_name(f),
                                       size_threshold_bytes=EXTERNAL_THRESHOLD, alignment=EXTERNAL_ALIGNMENT)


def dynamo_proto(program: Any, f: str | os.PathLike | None, external_data: bool | None) -> onnx.ModelProto:
    """The ModelProto of a dynamo ONNXProgram; with external data, tensors are first written to
    ``<f>.data`` and the proto refers to them."""
    import onnx_ir as ir

    model = program.model
    if f is None or not wants_external(external_data, tensor_bytes(model)):
        if f is None and external_data:
            raise ValueError("external_data=True needs a file name f to write the data beside")
        return ir.serde.serialize_model(model)
    _unload(model, f)
    return ir.serde.serialize_model(model)


def state_bytes(module: Any) -> int:
    """Bytes of a torch module's parameters and buffers (each storage once): what its exported
    initializers will weigh, known before exporting."""
    seen: set = set()
    total = 0
    if not hasattr(module, "parameters"):
        return 0
    for t in list(module.parameters()) + list(module.buffers()):
        storage = t.untyped_storage()
        # Views of one storage count once; meta tensors (sizes only, no data) all sit at 0.
        key = (storage.data_ptr(), storage.nbytes()) if storage.data_ptr() else id(t)
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def torchscript_proto(export_to: Callable[[Any], None], module: Any, f: str | os.PathLike | None,
                      external_data: bool | None) -> onnx.ModelProto:
    """Runs the TorchScript exporter (``export_to(target)``, target a BytesIO or a path) and
    returns the ModelProto. It exports into memory, which protobuf limits to 2 GB; past that (or
    when asked) it exports to a scratch folder beside ``f``, where torch writes one file per large
    tensor, and moves the tensors into the single ``<f>.data``."""
    import io

    if not wants_external(external_data, state_bytes(module) if external_data is None else 0):
        if f is None and external_data:
            raise ValueError("external_data=True needs a file name f to write the data beside")
        buf = io.BytesIO()
        export_to(buf)
        return onnx.load_from_string(buf.getvalue())
    if f is None:
        raise ValueError("this model's tensors exceed protobuf's 2 GB limit: pass a file name f, and "
                         "opbridge.onnx.export writes them to an external data file beside it")
    import onnx_ir as ir

    folder = os.path.dirname(os.path.abspath(os.fspath(f)))
    os.makedirs(folder, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".opbridge-export-", dir=folder)
    try:
        path = os.path.join(scratch, "model.onnx")
        export_to(path)
        model = ir.load(path)
        # Tensors too small for the data file would still point into the scratch folder: read
        # them now, before it goes.
        for graph in (model.graph, *model.graph.subgraphs()):
            for value in graph.initializers.values():
                t = value.const_value
                if isinstance(t, ir.ExternalTensor) and t.nbytes <= EXTERNAL_THRESHOLD:
                    value.const_value = ir.tensor(t.numpy(), name=t.name)
        _unload(model, f)
        return ir.serde.serialize_model(model)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from _tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _tensors(g)


def has_external_data(proto: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in _tensors(proto.graph))


def save(proto: onnx.ModelProto, f: str | os.PathLike, external_data: bool | None) -> None:
    """Writes ``proto`` to ``f``. A proto whose tensors are already in ``<f>.data`` is written
    alone; one that is asked to be external or is too large for one message gets its tensors
    written there now."""
    f = os.fspath(f)
    if has_external_data(proto):
        onnx.save(proto, f)
        return
    if wants_external(external_data, proto.ByteSize() if external_data is None else 0):
        onnx.save_model(proto, f, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_file_name(f), size_threshold=EXTERNAL_THRESHOLD)
        return
    onnx.save(proto, f)
