"""shapes: custom ops on opbridge (one C++ kernel per op for PyTorch and ONNX Runtime).

ONNX Runtime (no torch needed)::

    sess = onnxruntime.InferenceSession("model.onnx", shapes.session_options())

torch: the first use of an op (``shapes.<op>(...)``, or ``import shapes.ops``) loads the torch
extension (``torch.ops.shapes.<op>``) and registers each op's fake kernel and autograd formula;
importing the package does so too in a process that has already imported torch, as importing
opbridge does for opbridge's ops. Importing the package alone never imports torch.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from ._library import DOMAIN, NAMESPACE, get_library_path, library_spec, torch_library_path

if TYPE_CHECKING:  # named for type checkers only: importing the package imports neither
    import onnxruntime
    from opbridge._decl import OpLibrary

__all__ = ["DOMAIN", "NAMESPACE", "get_library_path", "library", "library_spec", "session_options",
           "torch_library_path"]


def library() -> OpLibrary:
    """This package's library, registered with opbridge (exports, ``opbridge check``,
    ``opbridge.testing``, ``opbridge.session_options``); an ``opbridge._decl.OpLibrary``."""
    from opbridge._decl import register_library

    return register_library(get_library_path(), namespace=NAMESPACE, torch_path=torch_library_path())


def session_options(so: onnxruntime.SessionOptions | None = None) -> onnxruntime.SessionOptions:
    """``so`` (or a new ``onnxruntime.SessionOptions``) with this package's ops and opbridge's
    registered."""
    import opbridge

    library()
    return opbridge.session_options(so)


# Torch only when used, as in opbridge: importing torch takes seconds, and the ONNX Runtime side
# needs none of it. The torch side loads on first use (shapes.<op>, shapes.ops), or here in a
# process that has already imported torch (so that torch.ops.shapes.* exist for an export or
# torch.export.load). A misdeclared op only warns here, so that the other ops (and the ONNX
# Runtime side) stay usable; ``import shapes.ops`` raises it (opbridge.MisdeclaredOpError).
if sys.modules.get("torch") is not None and torch_library_path() is not None:
    try:
        from . import ops  # noqa: F401
    except ValueError as _e:
        from opbridge import MisdeclaredOpError

        if not isinstance(_e, MisdeclaredOpError):
            raise
        import warnings

        warnings.warn(str(_e), RuntimeWarning, stacklevel=2)
        del _e


def __getattr__(name: str) -> Any:
    # The ops' Python functions (shapes.<op>), from the torch side.
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    ops = importlib.import_module(".ops", __name__)
    if name == "ops":
        return ops
    try:
        return getattr(ops, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
