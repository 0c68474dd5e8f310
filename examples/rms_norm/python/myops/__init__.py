"""myops: custom ops on opbridge (one C++ kernel per op for PyTorch and ONNX Runtime).

ONNX Runtime (no torch needed)::

    sess = onnxruntime.InferenceSession("model.onnx", myops.session_options())

torch: where torch is installed, importing the package loads the torch extension
(``torch.ops.myops.<op>``, ``myops.<op>(...)``) and registers each op's fake kernel and autograd
formula (``myops.ops``), as importing opbridge does for opbridge's ops.
"""

from __future__ import annotations

import importlib
import importlib.resources
import importlib.util
from typing import Any

NAMESPACE = "myops"  # torch.ops.myops.*: CMakeLists.txt's NAMESPACE
DOMAIN = "com.example.myops"  # the ONNX domain of the ops: CMakeLists.txt's DOMAIN

__all__ = ["DOMAIN", "NAMESPACE", "get_library_path", "library", "library_spec", "session_options",
           "torch_library_path"]


def _file(name: str) -> Any:
    # importlib.resources rather than __file__: also right for editable installs.
    return importlib.resources.files(__name__) / name


def get_library_path() -> str:
    """The ONNX Runtime custom-op library with this package's ops (domain com.example.myops)."""
    return str(_file("libmyops_ort.so"))


def torch_library_path() -> str | None:
    """The torch extension (None where it was not built)."""
    path = _file("libmyops_torch.so")
    return str(path) if path.is_file() else None


def library_spec() -> dict:
    """What the ``opbridge.libraries`` entry point announces (imports neither torch nor opbridge)."""
    return {"ort": get_library_path(), "namespace": NAMESPACE, "torch": torch_library_path()}


def library() -> Any:
    """This package's library, registered with opbridge (exports, ``opbridge check``,
    ``opbridge.testing``, ``opbridge.session_options``); an ``opbridge._decl.OpLibrary``."""
    from opbridge._decl import register_library

    return register_library(get_library_path(), namespace=NAMESPACE, torch_path=torch_library_path())


def session_options(so: Any = None) -> Any:
    """``so`` (or a new ``onnxruntime.SessionOptions``) with this package's ops and opbridge's
    registered."""
    import opbridge

    library()
    return opbridge.session_options(so)


# The torch side loads with the package where torch is installed (an export must know the ops
# before it traces the model); ONNX Runtime deployments without torch skip it.
if importlib.util.find_spec("torch") is not None and torch_library_path() is not None:
    from . import ops  # noqa: F401


def __getattr__(name: str) -> Any:
    # The ops' Python functions (myops.<op>), from the torch side.
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    ops = importlib.import_module(".ops", __name__)
    if name == "ops":
        return ops
    try:
        return getattr(ops, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
