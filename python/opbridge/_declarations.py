"""The op declaration model: what a library says of each op it implements.

Every op is declared once, in C++ (``opbridge/op_decl.h``; ours are in ``ops/<op>/<op>_decl.cpp``);
its library describes the declarations as JSON through opbridge's C ABI (read by
:mod:`opbridge._op_library`). From an :class:`OpDecl`, opbridge derives the torch fake kernels,
the onnx OpSchemas, both exporters' rules and ``opbridge check``'s knowledge of the op. Needs
neither torch nor onnxruntime nor onnx.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol, Sequence

__all__ = ["AttrDecl", "CheckError", "InputDecl", "MisdeclaredOpError", "OpDecl", "OutputDecl", "eval_dim"]

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

_ATTR_PY_TYPES: dict[str, Any] = {
    "bool": bool, "int": int, "float": float, "str": str,
    "int[]": lambda v: [int(x) for x in v], "float[]": lambda v: [float(x) for x in v],
}


def attr_value(type_name: str, value: Any) -> Any:
    """``value`` as the Python type of an attribute of declaration type ``type_name`` ("int",
    "float[]", ...); a value of any other type is returned as it is."""
    convert = _ATTR_PY_TYPES.get(type_name)
    return value if convert is None else convert(value)


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
        return attr_value(self.type, value)

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


class DeclaringLibrary(Protocol):
    """What an op's declaration reads of its library (an ``opbridge.OpLibrary``): where the op
    lives, and the C ABI entry points its checks and its CPU kernel run through."""

    domain: str
    namespace: str | None
    domain_version: int

    def check_call(self, op: OpDecl, inputs: Sequence[object], attrs: Mapping[str, object]) -> None: ...

    def run_entry(self) -> int: ...


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
    library: DeclaringLibrary = field(repr=False)
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

    def signature(self) -> inspect.Signature:
        """The Python signature of the torch op (names and defaults from the declaration)."""
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
