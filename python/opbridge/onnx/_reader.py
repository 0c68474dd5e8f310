"""Reading model files that someone else made: the one reader of ONNX files and their external
data for `opbridge check`, `opbridge optimize`, `opbridge.InferenceSession` and export's own
re-reads of the files it wrote.

A model file is untrusted input. Before any tensor is read (by opbridge, or by ONNX Runtime after
it), every tensor of the model (initializers, Constant and other tensor attributes, sparse
tensors, in every subgraph and model-local function) is checked from the graph alone:

* its element type is one ONNX defines, its dims are non-negative;
* inline: its data (raw bytes or typed values) has the size its type and dims need;
* external: the location is a relative path whose real path (symbolic links resolved) is a regular
  file inside the model's folder (also resolved); offset and length are non-negative decimal
  integers; offset + length lies within the file; the length is what its type and dims need.

A refusal is an UnreadableModel naming the model file, the tensor and the reason. A model that
passes is loaded with each external tensor memory-mapped from the real path checked here (never
from a path resolved again later).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
from typing import Any, Iterable, Iterator

import onnx


class UnreadableModel(ValueError):
    """The file cannot be read as an ONNX model; the message names the file and why (and, for a
    tensor, which)."""


class InvalidModel(ValueError):
    """The model is read, but its nodes do not fit the ops they call (an input, an attribute or a
    static shape that is wrong): the model needs fixing. The message names each node, its op and
    what was expected (``INVALID_MODEL`` heads it)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(f"{INVALID_MODEL}\n  " + "\n  ".join(problems))
        self.problems = problems


# The verdict on a model whose nodes do not fit their ops (InferenceSession, `opbridge check`, `optimize`).
INVALID_MODEL = ("the model is invalid: its nodes do not fit the ops they call (fix the model; where a line says "
                 "so, upgrade the op library):")


class MalformedGraph(UnreadableModel):
    """The file is read and its tensors pass the checks, but its graph is not one onnx_ir (under
    `optimize` and export's fusion) can take: a value defined twice, a graph output nothing
    defines. ONNX Runtime refuses such graphs too, which is how `opbridge check` reports them."""


# Bits per element of the fixed-size element types (STRING has none).
_BITS: dict[int, int] = {
    onnx.TensorProto.FLOAT: 32, onnx.TensorProto.UINT8: 8, onnx.TensorProto.INT8: 8, onnx.TensorProto.UINT16: 16,
    onnx.TensorProto.INT16: 16, onnx.TensorProto.INT32: 32, onnx.TensorProto.INT64: 64, onnx.TensorProto.BOOL: 8,
    onnx.TensorProto.FLOAT16: 16, onnx.TensorProto.DOUBLE: 64, onnx.TensorProto.UINT32: 32,
    onnx.TensorProto.UINT64: 64, onnx.TensorProto.COMPLEX64: 64, onnx.TensorProto.COMPLEX128: 128,
    onnx.TensorProto.BFLOAT16: 16,
}
for _name, _bits in (("FLOAT8E4M3FN", 8), ("FLOAT8E4M3FNUZ", 8), ("FLOAT8E5M2", 8), ("FLOAT8E5M2FNUZ", 8),
                     ("FLOAT8E8M0", 8), ("UINT4", 4), ("INT4", 4), ("FLOAT4E2M1", 4), ("UINT2", 2), ("INT2", 2),
                     ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)):
    if hasattr(onnx.TensorProto, _name):  # later onnx versions add types
        _BITS[getattr(onnx.TensorProto, _name)] = _bits

# Typed-value fields: (field, values per element) for the types stored there one value per element
# (two for complex); 4- and 2-bit types pack one byte of elements per int32 value (onnx.helper).
_FIELD: dict[int, tuple[str, float]] = {
    onnx.TensorProto.FLOAT: ("float_data", 1), onnx.TensorProto.COMPLEX64: ("float_data", 2),
    onnx.TensorProto.DOUBLE: ("double_data", 1), onnx.TensorProto.COMPLEX128: ("double_data", 2),
    onnx.TensorProto.INT64: ("int64_data", 1), onnx.TensorProto.UINT64: ("uint64_data", 1),
    onnx.TensorProto.UINT32: ("uint64_data", 1), onnx.TensorProto.STRING: ("string_data", 1),
}
_t: int
for _t in (onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8, onnx.TensorProto.UINT16,
           onnx.TensorProto.UINT8, onnx.TensorProto.BOOL, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
    _FIELD[_t] = ("int32_data", 1)
for _t, _bits in _BITS.items():
    if _t not in _FIELD and _bits in (6, 8):  # float8 and float6 types: one value per element
        _FIELD[_t] = ("int32_data", 1)
    elif _t not in _FIELD and _bits in (2, 4):
        _FIELD[_t] = ("int32_data", _bits / 8)  # one packed byte per int32: 2 (4-bit) or 4 (2-bit) elements

# ONNX Runtime reads an external tensor at this location from the address its offset gives, not
# from a file (a folder "*/_ORT_MEM_ADDR_" beside the model would pass the checks below); 1.31
# refuses it in a model file, older releases may not.
ORT_MEMORY_MARKER = "*/_ORT_MEM_ADDR_/*"
_DIGITS = re.compile(r"[0-9]+\Z")
_TYPE_NAMES = {v: k for k, v in onnx.TensorProto.DataType.items()}


@dataclasses.dataclass(frozen=True)
class ExternalData:
    """A validated external data entry: ``length`` bytes at ``offset`` of ``file`` (a real path
    inside the model's folder)."""

    tensor: str
    file: str
    offset: int
    length: int


# --------------------------------------------------------------------------------------------
# The graph
# --------------------------------------------------------------------------------------------


def read_graph(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """The model at ``path`` without its external data. UnreadableModel naming the file when it
    cannot be read, does not parse as protobuf, or has no graph or IR version."""
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped]  # protobuf ships no stubs

    path = os.fspath(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise UnreadableModel(f"cannot read {path}: {e.strerror or e}") from e
    if not stat.S_ISREG(st.st_mode):
        raise UnreadableModel(f"cannot read {path}: it is not a regular file")
    if st.st_size == 0:
        raise UnreadableModel(f"cannot read {path}: it is not an ONNX model (the file is empty)")
    try:
        proto = onnx.load(path, load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, TypeError, RecursionError, MemoryError) as e:
        raise UnreadableModel(f"cannot read {path}: it is not an ONNX model (protobuf cannot parse it: "
                              f"{short(e)})") from e
    except OSError as e:
        raise UnreadableModel(f"cannot read {path}: {e.strerror or e}") from e
    if not proto.HasField("graph") or proto.ir_version <= 0:
        raise UnreadableModel(f"cannot read {path}: it is not an ONNX model (it parses as protobuf but has no "
                              f"{'graph' if not proto.HasField('graph') else 'IR version'})")
    _check_names(proto, path)
    _check_attribute_names(proto, path)
    return proto


def _check_attribute_names(proto: onnx.ModelProto, path: str) -> None:
    """No node names an attribute twice: ONNX Runtime takes the first, onnx_ir the last, so the
    model `check` runs would not be the model `optimize` rewrites."""
    nodes = [n for g in graphs(proto) for n in g.node] + [n for fn in proto.functions for n in fn.node]
    for node in nodes:
        if len(node.attribute) > 1:
            names = [a.name for a in node.attribute]
            twice = next((name for name in names if names.count(name) > 1), None)
            if twice is not None:
                raise UnreadableModel(f"{path}: node {node.name or node.op_type!r} has attribute {twice!r} twice")


def _check_names(proto: onnx.ModelProto, path: str) -> None:
    """Every string field is text (protobuf hands out bytes for one that is not UTF-8, and onnx,
    onnx_ir and onnxscript take text for granted: a graph's name, a node's op type, an external
    data entry) and opset versions are versions."""
    # (message, where): where is (parent's where, field, index), spelled out only for a refusal.
    stack: list[tuple[Any, Any]] = [(proto, None)]
    while stack:  # iterative: a model nested as deep as protobuf allows
        message, where = stack.pop()
        for field, value in message.ListFields():
            kind = _KINDS.get(field)
            if kind is None:
                kind = _KINDS[field] = (field.type == _STRING, field.type == _MESSAGE, _is_repeated(field))
            string, submessage, repeated = kind
            if string:
                for i, text in enumerate(value if repeated else (value,)):
                    if not isinstance(text, str):
                        name = _spell((where, field.name, i if repeated else None))
                        raise UnreadableModel(f"{path}: {name} is not UTF-8 text ({bytes(text[:60])!r})")
            elif submessage:
                if repeated:
                    stack.extend((m, (where, field.name, i)) for i, m in enumerate(value))
                else:
                    stack.append((value, (where, field.name, None)))
    for imp in proto.opset_import:
        if not 1 <= imp.version < 2**31:
            raise UnreadableModel(f"{path}: the model imports domain {imp.domain!r} at version {imp.version}, which is "
                                  "not an opset version (1 to 2**31 - 1)")


_STRING = onnx.ModelProto.DESCRIPTOR.fields_by_name["producer_name"].TYPE_STRING
_MESSAGE = onnx.ModelProto.DESCRIPTOR.fields_by_name["producer_name"].TYPE_MESSAGE


_KINDS: dict[Any, tuple[bool, bool, bool]] = {}  # field descriptor: (string, message, repeated)


def _spell(where: Any) -> str:
    parts = []
    while where is not None:
        where, name, index = where
        parts.append(name if index is None else f"{name}[{index}]")
    return ".".join(["the model", *reversed(parts)])


def _is_repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 5.28; `label` is gone in 7
    return bool(repeated) if repeated is not None else field.label == field.LABEL_REPEATED


def short(e: BaseException) -> str:
    """The reason of ``e``: its own message, and that of the error under it where a library wraps
    one (onnx_ir's "Error calling _deserialize_graph with: NAME" says only where)."""
    texts = [str(e) or type(e).__name__]
    while e.__cause__ is not None and len(texts) < 4:
        e = e.__cause__
        texts.append(f"{type(e).__name__}: {e}")
    text = ": ".join(texts)
    return text if len(text) <= 400 else text[:400] + "..."


def graphs(proto: onnx.ModelProto) -> Iterator[onnx.GraphProto]:
    """The main graph, the graphs of training_info and every subgraph (of those and of model-local
    functions), iteratively: a model nested as deep as protobuf allows does not exhaust Python's
    recursion limit."""
    stack = [proto.graph]
    for info in proto.training_info:
        stack += [info.initialization, info.algorithm]
    for fn in proto.functions:
        for node in fn.node:
            stack.extend(_node_graphs(node))
        for a in fn.attribute_proto:  # attribute defaults
            stack.extend(_attribute_graphs(a))
    while stack:
        graph = stack.pop()
        yield graph
        for node in graph.node:
            stack.extend(_node_graphs(node))


def _attribute_graphs(a: onnx.AttributeProto) -> list[onnx.GraphProto]:
    return ([a.g] if a.HasField("g") else []) + list(a.graphs)


def _node_graphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [g for a in node.attribute for g in _attribute_graphs(a)]


def _tensors_of(a: onnx.AttributeProto, where: str) -> Iterator[tuple[onnx.TensorProto, str]]:
    if a.HasField("t"):
        yield a.t, where
    for t in a.tensors:
        yield t, where
    for s in ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + list(a.sparse_tensors):
        yield s.values, where
        yield s.indices, where


def _attribute_tensors(nodes: Iterable[onnx.NodeProto]) -> Iterator[tuple[onnx.TensorProto, str]]:
    for node in nodes:
        for a in node.attribute:
            yield from _tensors_of(a, f"attribute {a.name!r} of node {node.name or node.op_type!r}")


def tensors(proto: onnx.ModelProto) -> Iterator[tuple[onnx.TensorProto, str]]:
    """(TensorProto, where it is) for every tensor of the model."""
    for graph in graphs(proto):
        for t in graph.initializer:
            yield t, "initializer"
        for s in graph.sparse_initializer:
            yield s.values, "sparse initializer"
            yield s.indices, "sparse initializer"
        yield from _attribute_tensors(graph.node)
    for fn in proto.functions:
        yield from _attribute_tensors(fn.node)
        for a in fn.attribute_proto:
            yield from _tensors_of(a, f"the default of attribute {a.name!r} of function {fn.name!r}")


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


def _label(t: onnx.TensorProto, where: str) -> str:
    return f"tensor {t.name!r}" if t.name else f"the tensor of {where}"


def _expected_bytes(t: onnx.TensorProto) -> int | None:
    """Bytes of the data its type and dims need; None for strings."""
    bits = _BITS.get(t.data_type)
    if bits is None:
        return None
    return (int(math.prod(t.dims)) * bits + 7) // 8


def _check_type_and_dims(path: str, t: onnx.TensorProto, where: str) -> None:
    if t.data_type not in _BITS and t.data_type != onnx.TensorProto.STRING:
        raise UnreadableModel(f"{path}: {_label(t, where)} has element type {t.data_type}, which is not an ONNX "
                              "tensor type")
    bad = [d for d in t.dims if d < 0]
    if bad:
        raise UnreadableModel(f"{path}: {_label(t, where)} has a negative dim {bad[0]} (dims {list(t.dims)})")


def _check_inline(path: str, t: onnx.TensorProto, where: str) -> None:
    n = math.prod(t.dims)
    type_name = _TYPE_NAMES.get(t.data_type, str(t.data_type))
    if t.HasField("raw_data"):
        need = _expected_bytes(t)
        if need is None:
            raise UnreadableModel(f"{path}: {_label(t, where)} of type STRING has raw data, which ONNX does not allow")
        if len(t.raw_data) != need:
            raise UnreadableModel(f"{path}: {_label(t, where)} holds {len(t.raw_data)} bytes of data; its type "
                                  f"{type_name} and dims {list(t.dims)} need {need}")
        return
    field, per = _FIELD.get(t.data_type, (None, 1))
    if field is None:
        return
    have = len(getattr(t, field))
    need = math.ceil(n * per)
    if have != need and not (have == 0 and n == 0):
        raise UnreadableModel(f"{path}: {_label(t, where)} holds {have} values in {field}; its type {type_name} "
                              f"and dims {list(t.dims)} need {need}")


def _non_negative(path: str, t: onnx.TensorProto, where: str, key: str, text: str) -> int:
    if not _DIGITS.match(text):
        raise UnreadableModel(f"{path}: {_label(t, where)}: its external data {key} {text!r} is not a non-negative "
                              "decimal integer")
    return int(text)


def _check_external(path: str, t: onnx.TensorProto, where: str, folder: str, sizes: dict[str, int]) -> ExternalData:
    label = _label(t, where)
    entries: dict[str, str] = {}
    for e in t.external_data:
        if not isinstance(e.key, str) or not isinstance(e.value, str):
            raise UnreadableModel(f"{path}: {label}: its external data entry {e.key!r} is not UTF-8 text")
        if e.key in entries:
            raise UnreadableModel(f"{path}: {label}: its external data names {e.key!r} twice")
        entries[e.key] = e.value
    location = entries.get("location", "")
    if not location:
        raise UnreadableModel(f"{path}: {label} is stored as external data without a location")
    if "\x00" in location or os.path.isabs(location) or location.startswith(("\\", "/")) or (
            len(location) > 1 and location[1] == ":"):
        raise UnreadableModel(f"{path}: {label}: its external data location {location!r} is not a relative path in "
                              "the model's folder")
    if location == ORT_MEMORY_MARKER:
        raise UnreadableModel(f"{path}: {label}: its external data location {location!r} is ONNX Runtime's marker "
                              "for data in memory (the offset would be read as an address), which a model file may "
                              "not use")
    if t.data_type == onnx.TensorProto.STRING:
        raise UnreadableModel(f"{path}: {label} of type STRING is stored as external data, which ONNX does not allow")
    # The real path (links resolved, "..", ".") must be inside the model's folder (also resolved).
    real = os.path.realpath(os.path.join(folder, location))
    if os.path.commonpath([real, folder]) != folder or real == folder:
        raise UnreadableModel(f"{path}: {label}: its external data location {location!r} is outside the model's "
                              f"folder {folder} (it resolves to {real})")
    if real not in sizes:
        try:
            st = os.stat(real)
        except FileNotFoundError as e:
            raise UnreadableModel(f"{path}: {label}: its external data file {real} does not exist") from e
        except OSError as e:
            raise UnreadableModel(f"{path}: {label}: its external data file {real} cannot be read "
                                  f"({e.strerror or e})") from e
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableModel(f"{path}: {label}: its external data file {real} is not a regular file")
        sizes[real] = st.st_size
    size = sizes[real]
    offset = _non_negative(path, t, where, "offset", entries["offset"]) if "offset" in entries else 0
    if offset > size:
        raise UnreadableModel(f"{path}: {label}: its external data offset {offset} is past the end of {real} "
                              f"({size} bytes)")
    length = (_non_negative(path, t, where, "length", entries["length"]) if "length" in entries
              else size - offset)
    if offset + length > size:
        raise UnreadableModel(f"{path}: {label}: its external data file {real} is truncated ({size} bytes, the tensor "
                              f"needs bytes {offset} to {offset + length})")
    need = _expected_bytes(t)
    if need is not None and length != need:
        raise UnreadableModel(f"{path}: {label}: its external data holds {length} bytes; its type "
                              f"{_TYPE_NAMES.get(t.data_type, t.data_type)} and dims {list(t.dims)} need {need}")
    return ExternalData(tensor=t.name, file=real, offset=offset, length=length)


def check(proto: onnx.ModelProto, path: str | os.PathLike[str]) -> list[tuple[onnx.TensorProto, ExternalData]]:
    """Checks every tensor of ``proto`` (the model file at ``path``; module docstring) and returns
    the external ones with their validated data. UnreadableModel at the first problem."""
    path = os.fspath(path)
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    sizes: dict[str, int] = {}
    out = []
    for t, where in tensors(proto):
        _check_type_and_dims(path, t, where)
        if t.data_location == onnx.TensorProto.EXTERNAL:
            out.append((t, _check_external(path, t, where, folder, sizes)))
        elif t.data_location != onnx.TensorProto.DEFAULT:
            raise UnreadableModel(f"{path}: {_label(t, where)} has data location {t.data_location}, which is neither "
                                  "inline nor external")
        else:
            _check_inline(path, t, where)
    return out


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _pin(validated: list[tuple[onnx.TensorProto, ExternalData]]) -> None:
    """Each external tensor refers to its checked real path and canonical offset and length, so
    that no later reader resolves the location again."""
    for t, data in validated:
        del t.external_data[:]
        for key, value in (("location", data.file), ("offset", str(data.offset)), ("length", str(data.length))):
            e = t.external_data.add()
            e.key, e.value = key, value


def to_ir(proto: onnx.ModelProto, path: str | os.PathLike[str], *, pin: bool = True) -> Any:
    """``proto`` (read from ``path``, or written there) as an onnx_ir Model, after ``check``;
    external tensors are memory-mapped from their checked files when first read. ``pin``: the
    external entries of ``proto`` itself are rewritten to the checked real paths (absolute), so
    that nothing resolves a location again; for a proto that is going to be written as it is
    (export's own files), ``pin=False`` keeps its locations and reads them from beside ``path``."""
    import onnx_ir as ir

    validated = check(proto, path)
    if pin:
        _pin(validated)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as e:  # onnx_ir's own consistency checks (e.g. a value with two producers)
        raise MalformedGraph(f"cannot read the graph of {os.fspath(path)}: {short(e)}") from e
    if not pin and validated:
        ir.external_data.set_base_dir(model.graph, os.path.dirname(os.path.abspath(os.fspath(path))))
    return model


def load(path: str | os.PathLike[str]) -> Any:
    """The model at ``path`` as an onnx_ir Model, checked; external data stays on disk."""
    return to_ir(read_graph(path), path)


def load_with_data(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """The model at ``path`` as a ModelProto holding all its tensors (read from the checked files):
    for tools that need the data in the proto (onnx's reference evaluator)."""
    proto = read_graph(path)
    for t, data in check(proto, path):
        with open(data.file, "rb") as f:
            f.seek(data.offset)
            t.raw_data = f.read(data.length)
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
    return proto
