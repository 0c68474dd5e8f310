"""Where ``opbridge.onnx.export`` puts a model's tensors, and how it writes them without copies.

A ModelProto is one protobuf message and cannot be serialized past 2 GiB. With external data the
model file holds the graph and each large tensor's (location, offset, length) in ``<f>.data``
beside it; ONNX Runtime, ``onnx.load`` and ``opbridge check``/``optimize`` read that file from
the model's folder.

With a file target, ``export`` writes external data when asked (``external_data=True``) or, by
default, when the model's tensors pass AUTO_EXTERNAL_BYTES. The tensors then go to disk straight
from the exported model (from torch's own memory with the dynamo exporter): no serialized copy of
the model is ever made, and the ModelProto that ``export`` returns refers to the data file instead
of holding the tensors. Below that size the model stays in one file, as ``torch.onnx.export``
writes it with the TorchScript exporter.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from typing import Any, Callable, Iterator

import onnx


# Largest tensor (bytes) a protobuf message can hold in one piece; past this total the model must
# keep its tensors in an external data file.
PROTOBUF_LIMIT = 2**31 - 1
# With a file target, opbridge.onnx.export and optimize keep a model's tensors in an external data
# file past this many bytes (below it, in the model file, as before). Writing one file needs the
# serialized model in memory twice (the ModelProto, then its bytes); past 256 MiB that would exceed
# export's budget of one model size + 0.5 GB over torch.onnx.export's own peak, while external data is
# written one tensor at a time. It is also where ORT starts to gain from memory-mapping the tensors.
AUTO_EXTERNAL_BYTES = 256 << 20
# Tensors larger than this go to the external data file when one is written (onnx's own default).
EXTERNAL_THRESHOLD = 1024
# Offsets of large external tensors are aligned so that ONNX Runtime can memory-map them instead
# of copying (64 KiB: the allocation granularity it checks on every platform).
EXTERNAL_ALIGNMENT = 65536


class WriteError(OSError):
    """A file could not be written (a full disk, no permission); the message names it and why."""


@contextlib.contextmanager
def writing(path: str) -> Iterator[None]:
    """OSErrors inside the block become a WriteError naming ``path``."""
    try:
        yield
    except WriteError:
        raise
    except OSError as e:
        reason = e.strerror or str(e)
        raise WriteError(e.errno, f"cannot write {path}: {reason}") from e


@contextlib.contextmanager
def write_file(path: str) -> Iterator[str]:
    """Yields a temporary name beside ``path`` to write to; renamed to ``path`` when the block
    completes, removed when it fails (an OSError then becomes a WriteError naming ``path``)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    with writing(path):
        os.makedirs(folder, exist_ok=True)
        # A name only (the writer creates the file, with the usual permissions; mkstemp's are 0600).
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            yield tmp
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise


def tensor_bytes(model: Any) -> int:
    """Bytes of all initializers (what must fit in one protobuf message unless kept external)."""
    total = 0
    for graph in (model.graph, *model.graph.subgraphs()):
        for value in graph.initializers.values():
            t = value.const_value
            if t is not None:
                total += int(t.nbytes)
    return total


def data_file_name(path: str) -> str:
    """Name of the external data file written next to the model at ``path``."""
    return os.path.basename(os.fspath(path)) + ".data"


# Tensor bytes past which a model cannot be one protobuf message: the limit less room for the graph
# itself (nodes, names, shapes), which a large model's tensors dwarf.
IN_MEMORY_LIMIT = PROTOBUF_LIMIT - (64 << 20)


def wants_external(external_data: bool | None, nbytes: int) -> bool:
    """external_data as the caller gave it (True/False), or None: past AUTO_EXTERNAL_BYTES."""
    if external_data is not None and not isinstance(external_data, bool):
        raise TypeError(f"external_data must be True, False or None (automatic), got {external_data!r}")
    return bool(external_data) if external_data is not None else nbytes > AUTO_EXTERNAL_BYTES


def unload(model: Any, f: str | os.PathLike) -> None:
    """Writes ``model``'s (an onnx_ir Model) tensors over 1 KiB to ``<f>.data`` beside ``f``,
    one tensor at a time (large ones at 64 KiB-aligned offsets, so that ONNX Runtime can
    memory-map them), and makes the model refer to them there."""
    import onnx_ir as ir

    f = os.path.abspath(os.fspath(f))
    folder = os.path.dirname(f)
    os.makedirs(folder, exist_ok=True)
    # onnx_ir writes the data file under a temporary name and renames it when complete.
    with writing(os.path.join(folder, data_file_name(f))):
        ir.external_data.unload_from_model(model, folder, data_file_name(f), size_threshold_bytes=EXTERNAL_THRESHOLD,
                                           alignment=EXTERNAL_ALIGNMENT)


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


def torchscript_model(export_to: Callable[[Any], None], f: str | os.PathLike | None, external: bool,
                      stack: contextlib.ExitStack) -> Any:
    """Runs the TorchScript exporter (``export_to(target)``, target a BytesIO or a path) and
    returns the model as an onnx_ir Model.

    In one file (``external`` False) it exports into memory, which protobuf limits to 2 GB. With
    external data it exports to a scratch folder beside ``f`` (torch writes the model there, with
    one file per large tensor past 2 GB), which ``stack`` removes on exit: the model's tensors
    are read from there (memory-mapped) until ``unload`` writes them to ``<f>.data``."""
    import io

    import onnx_ir as ir

    if not external:
        buf = io.BytesIO()
        export_to(buf)
        proto = onnx.load_from_string(buf.getvalue())
        del buf
        return ir.serde.deserialize_model(proto)
    if f is None:
        raise ValueError("this model's tensors exceed protobuf's 2 GB limit: pass a file name f, and "
                         "opbridge.onnx.export writes them to an external data file beside it")
    folder = os.path.dirname(os.path.abspath(os.fspath(f)))
    os.makedirs(folder, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".opbridge-export-", dir=folder)
    stack.callback(shutil.rmtree, scratch, ignore_errors=True)
    path = os.path.join(scratch, "model.onnx")
    with writing(os.fspath(f)):  # the scratch folder is f's: a full disk there is f's problem
        export_to(path)
    return ir.load(path)


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


def save(proto: onnx.ModelProto, f: str | os.PathLike, external_data: bool | None = None) -> None:
    """Writes ``proto`` to ``f`` (under a temporary name, renamed when complete). A proto whose
    tensors are already in ``<f>.data`` is written alone; one too large for one message (more
    tensor bytes than the module's state foretold: the exporter's own constants) gets its tensors
    written there now, unless the caller asked for one file (``external_data=False``)."""
    f = os.fspath(f)
    if not has_external_data(proto) and proto.ByteSize() > PROTOBUF_LIMIT:
        if external_data is False:
            raise ValueError(f"external_data=False: the model ({proto.ByteSize() / 1e9:.2f} GB) cannot be one file "
                             f"{f}: protobuf's limit is 2 GB; leave external_data at None or True")
        import onnx_ir as ir

        model = ir.serde.deserialize_model(proto)
        unload(model, f)
        proto = ir.serde.serialize_model(model)
    with write_file(f) as tmp:
        onnx.save(proto, tmp)


__all__ = ["AUTO_EXTERNAL_BYTES", "IN_MEMORY_LIMIT", "has_external_data", "save", "state_bytes", "tensor_bytes", "torchscript_model",
           "unload", "wants_external"]
