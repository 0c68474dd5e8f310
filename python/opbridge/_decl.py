"""Op declarations, read from the libraries that implement them.

Every op is declared once, in C++ (``opbridge/op_decl.h``; ours are in
``ops/<op>/<op>_decl.cpp``). Every library built on opbridge exports opbridge's C ABI
(``opbridge/c_abi.h``): the declarations as JSON (``OpbridgeDescribeOps``), their checks
(``OpbridgeCheckCall``) and the CPU kernels (``OpbridgeRunHost``); this module reads them with
ctypes, so it needs neither torch nor onnxruntime nor onnx. opbridge's own ops are read from
``opbridge._core``, which links them, so neither the torch side nor ``_core`` needs the ORT
library. From an :class:`OpDecl`, opbridge derives the torch fake kernels, the onnx OpSchemas,
both exporters' rules and ``opbridge check``'s knowledge of the op.

Libraries: :func:`opbridge_library` (ours, domain ``ai.opbridge``, torch namespace ``opbridge``)
and those registered with :func:`register_library` (users' own ops), plus those installed
packages announce through the ``opbridge.libraries`` entry point (see :func:`discover`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

__all__ = [
    "AttrDecl",
    "CheckError",
    "InputDecl",
    "MisdeclaredOpError",
    "OpDecl",
    "OpLibrary",
    "OutputDecl",
    "SkippedEntryPoint",
    "discover",
    "find_op",
    "libraries",
    "opbridge_library",
    "register_library",
]

# ONNX element type numbers (TensorProto.DataType) <-> names used in messages.
ELEM_NAMES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
              10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128",
              16: "bfloat16"}
ONNX_TYPE_STRINGS = {1: "tensor(float)", 2: "tensor(uint8)", 3: "tensor(int8)", 4: "tensor(uint16)",
                     5: "tensor(int16)", 6: "tensor(int32)", 7: "tensor(int64)", 9: "tensor(bool)",
                     10: "tensor(float16)", 11: "tensor(double)", 12: "tensor(uint32)", 13: "tensor(uint64)",
                     14: "tensor(complex64)", 15: "tensor(complex128)", 16: "tensor(bfloat16)"}

# opbridge::StatusCode -> the exception torch raises for it (and so do the fake kernels).
STATUS_EXCEPTIONS = {1: ValueError, 2: TypeError, 3: NotImplementedError, 4: RuntimeError}

_NO_DEFAULT = object()


class CheckError(Exception):
    """A declaration's checks rejected a call: ``code`` (StatusCode) and ``message``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def exception(self, prefix: str) -> Exception:
        """The exception torch raises for this verdict, with torch's prefix ("opbridge::op: ")."""
        return STATUS_EXCEPTIONS.get(self.code, RuntimeError)(f"{prefix}: {self.message}")


class MisdeclaredOpError(ValueError):
    """An op whose declaration its library refuses (its ``error``): it has no torch op and no ORT
    kernel; the library's other ops are unaffected. ``ops``: op name -> what is wrong with it."""

    def __init__(self, message: str, ops: Mapping[str, str]) -> None:
        super().__init__(message)
        self.ops = dict(ops)


@dataclass(frozen=True)
class InputDecl:
    name: str
    onnx_name: str
    doc: str
    since: int
    type_var: str
    optional: bool
    rank: int
    min_rank: int
    shape: str
    host_memory: bool
    index: int  # position among the inputs
    # Of a backward op: an input that is the gradient of a forward output (not a forward argument).
    gradient: bool = False
    # Of a backward op: the index of the forward output this input is (saved by autograd), or -1.
    forward_output: int = -1


@dataclass(frozen=True)
class AttrDecl:
    name: str
    onnx_name: str
    doc: str
    since: int
    type: str  # "int", "float", "str", "bool", "int[]", "float[]"
    required: bool
    default: Any
    choices: tuple
    index: int  # position among the attributes

    @property
    def has_default(self) -> bool:
        return self.default is not _NO_DEFAULT

    def normalize(self, value: Any) -> Any:
        """``value`` as this attribute's Python type (bool for "bool", int for "int", ...)."""
        if self.type == "bool":
            return bool(value)
        if self.type == "int":
            return int(value)
        if self.type == "float":
            return float(value)
        if self.type == "str":
            return str(value)
        if self.type == "int[]":
            return [int(v) for v in value]
        if self.type == "float[]":
            return [float(v) for v in value]
        return value

    def is_default(self, value: Any) -> bool:
        return self.has_default and self.normalize(value) == self.normalize(self.default)


@dataclass(frozen=True)
class OutputDecl:
    name: str
    type_var: str
    rule: str
    doc: str
    keeps_memory_format: bool
    like: int  # input index whose shape the output has, or -1
    exprs: tuple  # per dimension (when like == -1) its postfix expression: ((kind, a, b), ...) as in DimTerm
    # False for integer and bool outputs and those declared not_differentiable(): autograd treats
    # them as constants, and a declared backward op takes no gradient for them.
    differentiable: bool = True

    def sizes(self, size: Any, attr: Any, dynamic: Any = None) -> list:
        """The output's dimensions (like == -1) for one call. size(input, dim) gives an input's
        size (an int, a torch SymInt, or None where unknown), attr(index) an int attribute's value,
        dynamic() a size for a "?" dimension (the input values decide; default None). A dimension
        is None where a size it reads is None."""
        return [eval_dim(e, size, attr, dynamic) for e in self.exprs]

    def single_input_dim(self, k: int) -> tuple[int, int] | None:
        """(input, dim) where dimension k of the rule is exactly that input's dimension, else None."""
        e = self.exprs[k]
        return (e[0][1], e[0][2]) if len(e) == 1 and e[0][0] == _DIM_INPUT else None


_DIM_CONST, _DIM_INPUT, _DIM_ATTR, _DIM_MUL, _DIM_FLOORDIV, _DIM_DYNAMIC = 0, 1, 2, 5, 6, 8
_DIM_BINARY = {3: lambda x, y: x + y, 4: lambda x, y: x - y, _DIM_MUL: lambda x, y: x * y,
               _DIM_FLOORDIV: lambda x, y: x // y, 7: lambda x, y: x % y}


def eval_dim(expr: Sequence[Sequence[int]], size: Any, attr: Any, dynamic: Any = None) -> Any:
    """Evaluates one dimension of an output rule (postfix, as DimTerm in op_decl.h): floor division
    and modulo as in Python, None where a size it reads is None (or a division by an unknown); a
    "?" dimension is dynamic() (None without it)."""
    stack: list = []
    for kind, a, b in expr:
        if kind == _DIM_DYNAMIC:
            stack.append(dynamic() if dynamic is not None else None)
        elif kind == _DIM_CONST:
            stack.append(a)
        elif kind == _DIM_INPUT:
            stack.append(size(a, b))
        elif kind == _DIM_ATTR:
            stack.append(int(attr(a)))
        else:
            y = stack.pop()
            x = stack.pop()
            stack.append(None if x is None or y is None or (kind >= _DIM_FLOORDIV and isinstance(y, int) and y == 0)
                         else _DIM_BINARY[kind](x, y))
    return stack[0]


def _exprs(output: Mapping[str, Any]) -> tuple:
    """An output's rule expressions (per dimension, postfix) from its JSON."""
    return tuple(tuple(tuple(t) for t in e) for e in output["exprs"])


@dataclass
class OpDecl:
    """One op's declaration, as its library describes it."""

    name: str
    onnx_type: str
    since: int
    doc: str
    args: list  # InputDecl | AttrDecl in torch order
    types: dict  # type variable -> [ONNX element type numbers]
    outputs: list
    library: "OpLibrary" = field(repr=False)
    # Of a backward op: (the forward op's name, the forward inputs whose gradients it returns).
    gradient_of: tuple | None = None
    # The op whose checks run on this op's arguments before its own (its C++ declaration's
    # gradient_of or args_of), or None.
    forward: str | None = None

    @property
    def inputs(self) -> list[InputDecl]:
        return [a for a in self.args if isinstance(a, InputDecl)]

    @property
    def check_order(self) -> list[InputDecl]:
        """The inputs in the order the checks compare them (dtypes, devices): forward arguments
        before gradients."""
        return sorted(self.inputs, key=lambda i: i.gradient)

    @property
    def attrs(self) -> list[AttrDecl]:
        return [a for a in self.args if isinstance(a, AttrDecl)]

    @property
    def domain(self) -> str:
        return self.library.domain

    @property
    def qualname(self) -> str:
        """The torch op name, ``namespace::name``; also the op's ``lowering`` key."""
        return f"{self.library.namespace}::{self.name}"

    @property
    def versions(self) -> list[int]:
        """Every op version with a different set of arguments, oldest first."""
        return sorted({self.since} | {a.since for a in self.args})

    @property
    def latest(self) -> int:
        return self.versions[-1]

    def signature(self) -> "inspect.Signature":
        """The Python signature of the torch op (names and defaults from the declaration)."""
        import inspect

        params = []
        for a in self.args:
            if isinstance(a, InputDecl):
                default = None if a.optional else inspect.Parameter.empty
            else:
                default = a.default if a.has_default else inspect.Parameter.empty
            params.append(inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
        return inspect.Signature(params)

    def arg(self, name: str) -> InputDecl | AttrDecl:
        for a in self.args:
            if a.name == name:
                return a
        raise KeyError(f"op {self.name} has no argument {name!r}")

    def attr_by_onnx_name(self, onnx_name: str) -> AttrDecl | None:
        return next((a for a in self.attrs if a.onnx_name == onnx_name), None)

    def required_version(self, present_inputs: Iterable[str] = (), attrs: Mapping[str, Any] | None = None) -> int:
        """The op version a node needs: its first version, raised by each later argument that is
        used (an optional input present; an attribute set to a value other than its default).
        Names are ONNX names."""
        v = self.since
        present = set(present_inputs)
        for i in self.inputs:
            if i.onnx_name in present:
                v = max(v, i.since)
        for name, value in (attrs or {}).items():
            a = self.attr_by_onnx_name(name)
            if a is not None and not a.is_default(value):
                v = max(v, a.since)
        return v

    def check(self, inputs: Sequence[Any], attrs: Mapping[str, Any]) -> None:
        """Runs the declaration's checks (the C++ ones the kernels run) on a call.

        inputs: per declared input, None (absent) or ``(elem_type, dims)`` with dims a sequence of
            ints (-1 where unknown) or None (rank unknown), optionally a third item: the host data
            (a C-contiguous int64 numpy array) of a host_memory input.
        attrs: torch name -> value (absent: the default).
        Raises CheckError when the call is rejected."""
        self.library.check_call(self, inputs, attrs)

    @property
    def type_strings(self) -> dict[str, list[str]]:
        return {k: [ONNX_TYPE_STRINGS[t] for t in v] for k, v in self.types.items()}

    def run(self, *args: Any, isa: str = "auto", channels_last: bool = False, **kwargs: Any) -> Any:
        """Runs the op's CPU kernel on arrays (numpy, ml_dtypes.bfloat16 numpy arrays, or anything
        with ``__dlpack__``) through its library (opbridge._core): the arguments of the torch op,
        by position or name, checked by the declaration (the same messages as torch and ORT,
        prefixed with the op's name); returns numpy arrays (one, or a tuple for several outputs).

        isa: the kernels' instruction-set variant ('auto': _core's level, see
            ``_core.set_cpu_isa``; 'baseline', 'avx2', 'avx512').
        channels_last: for ops whose output keeps its input's memory format: that input, the
            inputs of its rank and those outputs are (N, *spatial, C) arrays (NHWC)."""
        from . import _core

        bound = self.signature().bind(*args, **kwargs)
        bound.apply_defaults()
        like = next((o.like for o in self.outputs if o.keeps_memory_format and o.like >= 0), -1)
        if channels_last and like < 0:
            raise ValueError(f"{self.name}: channels_last=True: its outputs do not keep an input's memory format")
        like_value = bound.arguments[self.inputs[like].name] if like >= 0 else None
        like_rank = getattr(like_value, "ndim", -1)
        inputs = []
        for i in self.inputs:
            value = bound.arguments[i.name]
            inputs.append((i.name, value, bool(channels_last and getattr(value, "ndim", -2) == like_rank)))
        attrs = []
        for a in self.attrs:
            value = bound.arguments[a.name]
            attrs.append((a.type, None if value is None else a.normalize(value)))
        outs = _core.run(self.library.run_entry(), self.name, inputs, attrs,
                         [o.keeps_memory_format for o in self.outputs], isa, bool(channels_last))
        return outs[0] if len(outs) == 1 else tuple(outs)


# ---------------------------------------------------------------- the C ABI (opbridge/c_abi.h)

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


class OpLibrary:
    """A library of ops built on opbridge, with the declarations of its ops.

    ort_path: its ONNX Runtime custom-op library (``lib<name>_ort.so``). namespace: the torch
    namespace of its ops (``TORCH_LIBRARY`` name) where it has a torch extension. torch_path: that
    extension, loaded by :meth:`load_torch` (``torch.ops.load_library``). c_abi_path: the binary
    whose C ABI (``opbridge/c_abi.h``) gives the declarations, their checks and the CPU kernels
    (default: ort_path; any of the library's binaries exports it)."""

    def __init__(self, ort_path: str | os.PathLike, namespace: str | None = None,
                 torch_path: str | os.PathLike | None = None, *,
                 c_abi_path: str | os.PathLike | None = None) -> None:
        self.path = os.fspath(ort_path)
        self.c_abi_path = os.fspath(c_abi_path) if c_abi_path is not None else self.path
        try:
            self._lib = ctypes.CDLL(self.c_abi_path)
        except OSError as e:
            raise OSError(f"opbridge: cannot load the custom-op library {self.c_abi_path}: {e}") from e
        try:
            describe = self._lib.OpbridgeDescribeOps
            self._check = self._lib.OpbridgeCheckCall
        except AttributeError as e:
            raise ValueError(f"{self.c_abi_path} is not an ORT custom-op library built on opbridge "
                             "(it has no OpbridgeDescribeOps entry point)") from e
        layout = library_c_abi_layout(self._lib)
        if layout != c_abi_layout():
            from ._version import __version__

            found = "none (built with an earlier opbridge)" if layout is None else f"version {layout.get('version')}"
            raise ValueError(f"{self.c_abi_path} was built with another opbridge's C ABI ({found}; this opbridge "
                             f"{__version__} has version {C_ABI_VERSION}): rebuild it against this opbridge")
        describe.restype = ctypes.c_char_p
        self._check.restype = ctypes.c_int32
        self._check.argtypes = [ctypes.c_char_p, ctypes.POINTER(OpbridgeTensor), ctypes.c_int64,
                                ctypes.POINTER(OpbridgeAttr), ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64]
        # Text the declarations hold (docs) is the user's: one op's stray byte must not make the
        # whole library unreadable.
        info = json.loads(describe().decode(errors="replace"))
        self.domain: str = info["domain"]
        self.domain_version: int = int(info["domain_version"])
        self.namespace = namespace
        self.torch_path = os.fspath(torch_path) if torch_path is not None else None
        self.ops: dict[str, OpDecl] = {}
        # Misdeclared ops (name -> (ONNX op type, what is wrong)): refused here as in torch and ORT,
        # where they have neither a torch op nor a kernel; the library's other ops work.
        self.refused: dict[str, tuple[str, str]] = {}
        for o in info["ops"]:
            if o.get("error"):
                self.refused[o["name"]] = (o["onnx_type"], o["error"])
                continue
            args: list = []
            n_in = n_attr = 0
            for a in o["args"]:
                if a["kind"] == "input":
                    args.append(InputDecl(a["name"], a["onnx_name"], a["doc"], a["since"], a["type_var"],
                                          a["optional"], a["rank"], a["min_rank"], a["shape"], a["host_memory"], n_in,
                                          bool(a.get("gradient", False)), int(a.get("forward_output", -1))))
                    n_in += 1
                else:
                    args.append(AttrDecl(a["name"], a["onnx_name"], a["doc"], a["since"], a["type"], a["required"],
                                         a.get("default", _NO_DEFAULT), tuple(a["choices"]), n_attr))
                    n_attr += 1
            outputs = [OutputDecl(x["name"], x["type_var"], x["rule"], x["doc"], x["keeps_memory_format"], x["like"],
                                  _exprs(x), bool(x.get("differentiable", True))) for x in o["outputs"]]
            grad = o.get("gradient_of")
            self.ops[o["name"]] = OpDecl(o["name"], o["onnx_type"], o["since"], o["doc"], args,
                                         {k: list(v) for k, v in o["types"].items()}, outputs, self,
                                         (grad["op"], tuple(grad["wrt"])) if grad else None,
                                         o.get("forward", grad["op"] if grad else None))

    def __repr__(self) -> str:
        return f"OpLibrary({self.path!r}, domain={self.domain!r}, ops={sorted(self.ops)})"

    def run_entry(self) -> int:
        """The address of the library's OpbridgeRunHost (what opbridge._core runs its ops through)."""
        return ctypes.cast(self._lib.OpbridgeRunHost, ctypes.c_void_p).value

    def backward_of(self, name: str) -> OpDecl | None:
        """The declared backward op of op ``name`` (the op whose gradient_of names it), if any."""
        return next((op for op in self.ops.values() if op.gradient_of and op.gradient_of[0] == name), None)

    def by_onnx_type(self, onnx_type: str) -> OpDecl | None:
        return next((op for op in self.ops.values() if op.onnx_type == onnx_type), None)

    def misdeclared(self, names: Iterable[str] | None = None) -> MisdeclaredOpError | None:
        """The error for the library's misdeclared ops (those among ``names``, op names or ONNX op
        types, where given), or None where there is none."""
        wanted = None if names is None else set(names)
        ops = {name: error for name, (onnx_type, error) in self.refused.items()
               if wanted is None or name in wanted or onnx_type in wanted}
        if not ops:
            return None
        lines = "\n".join(f"  {error}" for error in ops.values())
        return MisdeclaredOpError(
            f"{self.path}: {len(ops)} misdeclared op{'s' if len(ops) > 1 else ''} ({', '.join(ops)}), which "
            f"neither torch nor ONNX Runtime can run; the library's other ops can. Fix the declaration"
            f"{'s' if len(ops) > 1 else ''}:\n{lines}", ops)

    def check_call(self, op: OpDecl, inputs: Sequence[Any], attrs: Mapping[str, Any]) -> None:
        keep: list = []  # buffers ctypes points into, alive until the call returns
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
        buf = ctypes.create_string_buffer(2048)
        code = self._check(op.name.encode(), tensors, len(op.inputs), attr_structs, len(op.attrs), buf, len(buf))
        if code != 0:
            raise CheckError(int(code), buf.value.decode(errors="replace"))

    def load_torch(self) -> None:
        """Loads the library's torch extension (its ops appear under torch.ops.<namespace>)."""
        if self.torch_path is None:
            raise ValueError(f"{self!r} has no torch extension (pass torch_path=)")
        import torch

        torch.ops.load_library(self.torch_path)


# ---------------------------------------------------------------- the known libraries

_registered: dict[str, OpLibrary] = {}
# What register_library tells about each new library: the layers above this one subscribe
# (opbridge.onnx registers the new ops' OpSchemas with onnx) instead of being called from here.
_listeners: list = []


def on_register(listener: Any) -> None:
    """Calls ``listener(library)`` for every library :func:`register_library` adds from now on."""
    if listener not in _listeners:
        _listeners.append(listener)


@functools.lru_cache(maxsize=None)
def opbridge_library() -> OpLibrary:
    """opbridge's own ops (domain ai.opbridge, torch namespace opbridge), read from opbridge._core
    (the ORT library where this build has no _core)."""
    from ._library import get_library_path

    try:
        from . import _core
    except ImportError:
        return OpLibrary(get_library_path(), namespace="opbridge")
    return OpLibrary(get_library_path(), namespace="opbridge", c_abi_path=_core.__file__)


def register_library(ort_path: str | os.PathLike, namespace: str | None = None,
                     torch_path: str | os.PathLike | None = None) -> OpLibrary:
    """Makes a library of your own ops known to opbridge (exports, fake kernels, ``check``,
    ``opbridge.testing``); returns it. Registering the same path again returns the same object."""
    key = os.path.realpath(os.fspath(ort_path))
    lib = _registered.get(key)
    if lib is None:
        lib = OpLibrary(ort_path, namespace=namespace, torch_path=torch_path)
        for other in libraries():
            if other.domain == lib.domain and os.path.realpath(other.path) != key:
                raise ValueError(f"{lib.path} registers domain {lib.domain!r}, which {other.path} already uses")
        _registered[key] = lib
        # Where opbridge.onnx is in use, onnx learns the new ops' OpSchemas now (onnx.checker,
        # shape inference, the check for unknown attributes); its import registers the others.
        for listener in list(_listeners):
            listener(lib)
    else:
        if namespace is not None and lib.namespace is None:
            lib.namespace = namespace
        if torch_path is not None and lib.torch_path is None:
            lib.torch_path = os.fspath(torch_path)
    return lib


def libraries() -> list[OpLibrary]:
    """opbridge's library first, then the registered ones, in registration order."""
    return [opbridge_library(), *_registered.values()]


# How long one ``opbridge.libraries`` entry point may take to import and answer (seconds), unless
# OPBRIDGE_DISCOVER_TIMEOUT says otherwise. A package made by ``opbridge new-op`` answers in
# milliseconds (its ``_library`` module reads two paths); importing torch takes seconds, and is
# what the limit guards against along with packages that hang. 5 s leaves a slow, loaded machine
# a wide margin before a working package is skipped.
DISCOVER_TIMEOUT_S = 5.0
DISCOVER_TIMEOUT_ENV = "OPBRIDGE_DISCOVER_TIMEOUT"


@dataclass
class SkippedEntryPoint:
    """An ``opbridge.libraries`` entry point :func:`discover` did not register, and why."""

    name: str  # the entry point's name
    value: str  # "module:attr"
    package: str  # the distribution that declares it ("?" where unknown)
    reason: str

    def __str__(self) -> str:
        return (f"package {self.package} (entry point opbridge.libraries: {self.name} = {self.value}): "
                f"{self.reason}")


def discover_timeout() -> float:
    """Seconds one entry point may take: OPBRIDGE_DISCOVER_TIMEOUT, or DISCOVER_TIMEOUT_S."""
    text = os.environ.get(DISCOVER_TIMEOUT_ENV, "").strip()
    if not text:
        return DISCOVER_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{DISCOVER_TIMEOUT_ENV} must be a number of seconds > 0, got {text!r}")
    return value


@contextlib.contextmanager
def _torch_hidden() -> Iterator[bool]:
    # None in sys.modules makes `import torch` raise ImportError and importlib.util.find_spec
    # ("torch") return None, so a package that loads its torch side when torch is installed skips
    # it (as the packages older `opbridge new-op` made do). A process that has already imported
    # torch keeps it. Yields whether torch is hidden.
    if "torch" in sys.modules:
        yield False
        return
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        yield True
    finally:
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]


class _Unusable(Exception):
    """An entry point that gave no library; the message says why, in full."""


def _load_spec(ep: Any, timeout: float) -> Any:
    """Imports the entry point and calls it, in a thread given ``timeout`` seconds. Returns the
    spec; raises _Unusable (too slow, SystemExit), or what the import or the call raised."""
    box: dict[str, Any] = {}

    def load() -> None:
        try:
            box["spec"] = ep.load()()
        except BaseException as e:  # noqa: BLE001  (SystemExit too: a package's problem, not ours)
            box["error"] = e

    # A daemon thread: one that never returns (a package that hangs at import) is left behind and
    # does not keep the process alive.
    t = threading.Thread(target=load, name=f"opbridge-discover-{ep.name}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise _Unusable(f"importing it and calling it took over {timeout:g} s (the limit, "
                           f"{DISCOVER_TIMEOUT_ENV}); opbridge stopped waiting")
    error = box.get("error")
    if error is not None:
        if not isinstance(error, Exception):  # SystemExit and friends: reported like the others
            raise _Unusable(f"it raised {type(error).__name__}({error})") from error
        raise error
    return box["spec"]


def _discover() -> tuple[list[OpLibrary], list[SkippedEntryPoint]]:
    from importlib.metadata import entry_points

    timeout = discover_timeout()
    found: list[OpLibrary] = []
    skipped: list[SkippedEntryPoint] = []
    with _torch_hidden() as torch_hidden:
        for ep in entry_points(group="opbridge.libraries"):
            dist = getattr(ep, "dist", None)
            package = getattr(dist, "name", None) or ep.value.split(":", 1)[0].split(".", 1)[0] or "?"
            try:
                spec = _load_spec(ep, timeout)
                if not isinstance(spec, Mapping) or not isinstance(spec.get("ort"), (str, os.PathLike)):
                    raise _Unusable(f"it returned {spec!r}; expected a dict {{'ort': path, 'namespace': ns, "
                                    "'torch': path or None}")
                found.append(register_library(spec["ort"], namespace=spec.get("namespace"),
                                              torch_path=spec.get("torch")))
            except Exception as e:  # noqa: BLE001  (reported by name, never fatal)
                reason = str(e) if isinstance(e, _Unusable) else f"{type(e).__name__}: {e}"
                if torch_hidden and isinstance(e, ImportError) and (e.name or "").split(".")[0] == "torch":
                    reason = ("it imports torch, which opbridge hides while it loads these entry points: the "
                              "module an entry point names (and its package's __init__) must import neither "
                              "torch nor the package's torch side, as the <package>._library module of an "
                              f"`opbridge new-op` project does ({reason})")
                skipped.append(SkippedEntryPoint(ep.name, ep.value, package, reason))
    return found, skipped


def discover() -> list[OpLibrary]:
    """Registers the libraries installed packages announce: entry points of group
    ``opbridge.libraries`` naming a callable that returns ``{"ort": path, "namespace": ns,
    "torch": path or None}`` (the packages ``opbridge new-op`` makes do). Imports no torch: in a
    process that has not imported torch, the entry points are loaded with torch hidden. An entry
    point that fails (import, call, library), or takes over OPBRIDGE_DISCOVER_TIMEOUT seconds
    (default 5) is skipped with a RuntimeWarning naming its package. Returns the libraries found."""
    found, skipped = _discover()
    for s in skipped:
        warnings.warn(f"opbridge: skipped the op library of {s}", RuntimeWarning, stacklevel=2)
    return found


def _core_function(name: str) -> Any:
    """``opbridge._core.<name>``: the op ``name`` of opbridge's library on arrays (OpDecl.run)."""
    op = opbridge_library().ops.get(str(name)) if not str(name).startswith("__") else None
    if op is None:
        raise AttributeError(f"module 'opbridge._core' has no attribute {name!r}")

    def run(*args: Any, isa: str = "auto", channels_last: bool = False, **kwargs: Any) -> Any:
        return op.run(*args, isa=isa, channels_last=channels_last, **kwargs)

    run.__name__ = op.name
    run.__qualname__ = op.name
    run.__doc__ = f"{op.doc}\n\nopbridge's CPU kernel on arrays: see OpDecl.run (isa, channels_last)."
    return run


def find_op(domain: str, onnx_type: str) -> OpDecl | None:
    """The declaration of the ONNX op ``domain::onnx_type`` among the known libraries."""
    for lib in libraries():
        if lib.domain == domain:
            op = lib.by_onnx_type(onnx_type)
            if op is not None:
                return op
    return None
