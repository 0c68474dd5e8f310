"""opbridge's C ABI (``opbridge/c_abi.h``) as ctypes sees it: the structures a call's inputs and
attributes cross it in, their layout (checked against each binary's ``OpbridgeAbiLayout``), and
the encoding of one call for ``OpbridgeCheckCall``."""

from __future__ import annotations

import ctypes
import json
from typing import Any, Mapping, Sequence

from ._declarations import OpDecl

__all__ = ["C_ABI_VERSION", "OpbridgeAttr", "OpbridgeTensor", "c_abi_layout", "encode_call", "library_c_abi_layout"]


# OPBRIDGE_C_ABI_VERSION of the header these structures mirror.
C_ABI_VERSION = 1


class OpbridgeTensor(ctypes.Structure):
    _fields_ = [("present", ctypes.c_int32), ("type", ctypes.c_int32), ("rank", ctypes.c_int64),
                ("dims", ctypes.POINTER(ctypes.c_int64)), ("data", ctypes.c_void_p)]


class OpbridgeAttr(ctypes.Structure):
    _fields_ = [("present", ctypes.c_int32), ("i", ctypes.c_int64), ("f", ctypes.c_double),
                ("s", ctypes.c_char_p), ("n", ctypes.c_int64), ("ints", ctypes.POINTER(ctypes.c_int64)),
                ("floats", ctypes.POINTER(ctypes.c_double))]


def c_abi_layout() -> dict:
    """The C ABI as the structures above lay it out, in the form a library's OpbridgeAbiLayout()
    gives it: ``{"version": n, "OpbridgeTensor": {"size": bytes, "fields": [[name, offset,
    bytes], ...]}, ...}``."""
    layout: dict = {"version": C_ABI_VERSION}
    for cls in (OpbridgeTensor, OpbridgeAttr):
        layout[cls.__name__] = {"size": ctypes.sizeof(cls),
                                "fields": [[name, getattr(cls, name).offset, getattr(cls, name).size]
                                           for name, _ in cls._fields_]}
    return layout


def library_c_abi_layout(lib: ctypes.CDLL) -> dict | None:
    """What a loaded library's OpbridgeAbiLayout() says (None where it has none)."""
    try:
        fn = lib.OpbridgeAbiLayout
    except AttributeError:
        return None
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    return json.loads(fn().decode())


def encode_call(op: OpDecl, inputs: Sequence[Any], attrs: Mapping[str, Any]) -> tuple[Any, Any, list]:
    """One call of ``op`` as OpbridgeCheckCall takes it: (tensors, attributes, keep), keep being the
    buffers ctypes points into, to hold alive until the call returns. inputs and attrs: as
    :meth:`OpDecl.check` takes them."""
    keep: list = []
    tensors = (OpbridgeTensor * max(1, len(op.inputs)))()
    for k, decl in enumerate(op.inputs):
        desc = inputs[k] if k < len(inputs) else None
        if desc is None:
            continue
        elem, dims = desc[0], desc[1]
        t = tensors[k]
        t.present = 1
        t.type = int(elem)
        if dims is None:
            t.rank = -1
        else:
            arr = (ctypes.c_int64 * max(1, len(dims)))(*[int(d) for d in dims])
            keep.append(arr)
            t.rank = len(dims)
            t.dims = ctypes.cast(arr, ctypes.POINTER(ctypes.c_int64))
        if len(desc) > 2 and desc[2] is not None and decl.host_memory:
            data = desc[2]
            keep.append(data)
            t.data = data.ctypes.data
    attr_structs = (OpbridgeAttr * max(1, len(op.attrs)))()
    for k, decl in enumerate(op.attrs):
        if decl.name not in attrs or attrs[decl.name] is None:
            continue
        value = decl.normalize(attrs[decl.name])
        a = attr_structs[k]
        a.present = 1
        if decl.type in ("int", "bool"):
            a.i = int(value)
        elif decl.type == "float":
            a.f = float(value)
        elif decl.type == "str":
            b = value.encode()
            keep.append(b)
            a.s = b
        elif decl.type == "int[]":
            arr = (ctypes.c_int64 * max(1, len(value)))(*value)
            keep.append(arr)
            a.n, a.ints = len(value), ctypes.cast(arr, ctypes.POINTER(ctypes.c_int64))
        elif decl.type == "float[]":
            arr = (ctypes.c_double * max(1, len(value)))(*value)
            keep.append(arr)
            a.n, a.floats = len(value), ctypes.cast(arr, ctypes.POINTER(ctypes.c_double))
    return tensors, attr_structs, keep
