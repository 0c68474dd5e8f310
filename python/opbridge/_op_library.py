"""The op libraries opbridge knows: :class:`OpLibrary` (a library built on opbridge, read through
its C ABI: the declarations, their checks, the CPU kernels) and the registry of known ones:
:func:`opbridge_library` (ours, domain ``ai.opbridge``, torch namespace ``opbridge``, read from
``opbridge._core``, so neither the torch side nor ``_core`` needs the ORT library) and those
registered with :func:`register_library` (users' own ops, or announced by installed packages:
:mod:`opbridge._discovery`). Needs neither torch nor onnxruntime nor onnx.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
from typing import Any, Iterable, Mapping, Sequence

from ._c_abi import OpbridgeAttr, OpbridgeTensor, c_abi_layout, encode_call, library_c_abi_layout
from ._declarations import _NO_DEFAULT, AttrDecl, CheckError, InputDecl, MisdeclaredOpError, OpDecl, OutputDecl

__all__ = ["OpLibrary", "find_op", "libraries", "on_register", "opbridge_library", "register_library",
           "registered"]


def _exprs(output: Mapping[str, Any]) -> tuple:
    """An output's rule expressions (per dimension, postfix) from its JSON."""
    return tuple(tuple(tuple(t) for t in e) for e in output["exprs"])


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
        expected = c_abi_layout()
        if layout != expected:
            from ._version import __version__

            found = "none (built with an earlier opbridge)" if layout is None else f"version {layout.get('version')}"
            raise ValueError(f"{self.c_abi_path} was built with another opbridge's C ABI ({found}; this opbridge "
                             f"{__version__} has version {expected['version']}): rebuild it against this opbridge")
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

    def check_call(self, op: OpDecl, inputs: Sequence[object], attrs: Mapping[str, object]) -> None:
        """Runs ``op``'s declared checks on a call (see :meth:`OpDecl.check`); raises CheckError."""
        tensors, attr_structs, keep = encode_call(op, inputs, attrs)
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


def registered() -> list[OpLibrary]:
    """The libraries registered with :func:`register_library`, in registration order."""
    return list(_registered.values())


def libraries() -> list[OpLibrary]:
    """opbridge's library first, then the registered ones, in registration order."""
    return [opbridge_library(), *_registered.values()]


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
