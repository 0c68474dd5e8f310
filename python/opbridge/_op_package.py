"""An op package: a Python package of one's own ops built on opbridge (what ``opbridge new-op``
makes). Its ``__init__.py`` is one call to :func:`op_package`; its ``ops`` subpackage, the torch
side, is one call to :func:`opbridge.ops.load_package_ops`.

The split between the two keeps the ONNX Runtime side torch-free: importing the package reads two
paths and registers nothing; ``library()`` and ``session_options()`` need no torch; the torch
extension loads on first use of an op, or at import in a process that has already imported torch
(so that ``torch.ops.<namespace>.*`` exist for an export or ``torch.export.load``), as opbridge
does for its own ops.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from typing import TYPE_CHECKING, Callable

from ._declarations import MisdeclaredOpError
from ._op_library import OpLibrary, register_library

if TYPE_CHECKING:  # not a dependency (docs/install.md): named, not imported
    import onnxruntime

__all__ = ["op_package", "package_library"]

# Package name -> the function that registers its library (what its ``library`` attribute is).
_packages: dict[str, Callable[[], OpLibrary]] = {}


def package_library(package: str) -> OpLibrary:
    """The library of op package ``package`` (registered with opbridge on first use)."""
    try:
        library = _packages[package]
    except KeyError:
        raise ValueError(f"package={package!r}: expected a package that called opbridge.op_package(); "
                         f"known: {sorted(_packages)}") from None
    return library()


def op_package(
    package: str,
    ort_path: str | os.PathLike[str],
    *,
    namespace: str,
    torch_path: str | os.PathLike[str] | None = None,
) -> tuple[Callable[[], OpLibrary], Callable[..., onnxruntime.SessionOptions], Callable[[str], object]]:
    """Makes ``package`` (its ``__name__``) an op package; returns its ``library``,
    ``session_options`` and module ``__getattr__``::

        library, session_options, __getattr__ = opbridge.op_package(
            __name__, get_library_path(), namespace=NAMESPACE, torch_path=torch_library_path())

    ``library()``: the package's :class:`OpLibrary`, registered with opbridge (exports,
    ``opbridge check``, ``opbridge.testing``, ``opbridge.session_options``).
    ``session_options(so=None)``: ``so`` (or a new ``onnxruntime.SessionOptions``) with the
    package's ops and opbridge's registered. ``__getattr__``: ``package.<op>`` and
    ``package.ops`` import the torch side (``package.ops``) on first use.

    In a process that has already imported torch (and where ``torch_path`` is given), this also
    imports ``package.ops``; a misdeclared op then only warns, so that the other ops and the ONNX
    Runtime side stay usable (``import package.ops`` raises :class:`MisdeclaredOpError`)."""
    if not isinstance(namespace, str) or not namespace.isidentifier():
        raise ValueError(f"namespace={namespace!r}: expected the torch namespace of the ops, a Python identifier "
                         "(CMakeLists.txt's NAMESPACE)")

    def library() -> OpLibrary:
        return register_library(ort_path, namespace=namespace, torch_path=torch_path)

    def session_options(so: onnxruntime.SessionOptions | None = None) -> onnxruntime.SessionOptions:
        from ._session import session_options as opbridge_session_options

        library()
        return opbridge_session_options(so)

    def __getattr__(name: str) -> object:
        # The ops' Python functions (package.<op>), from the torch side.
        if name.startswith("_"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        ops = importlib.import_module(f"{package}.ops")
        if name == "ops":
            return ops
        try:
            return getattr(ops, name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    library.__doc__ = f"{package}'s library, registered with opbridge."
    session_options.__doc__ = (f"``so`` (or a new onnxruntime.SessionOptions) with {package}'s ops and "
                               "opbridge's registered.")
    _packages[package] = library

    if sys.modules.get("torch") is not None and torch_path is not None:
        try:
            importlib.import_module(f"{package}.ops")
        except MisdeclaredOpError as e:
            warnings.warn(str(e), RuntimeWarning, stacklevel=2)
    return library, session_options, __getattr__
