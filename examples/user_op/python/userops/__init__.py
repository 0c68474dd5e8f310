"""userops: LogCumSumExp, an op of our own built on opbridge (see examples/user_op/).

    import userops
    y = userops.log_cumsum_exp(x, dim=-1)              # torch (CPU); loads the torch side
    opbridge.onnx.export(model, (x,), "m.onnx")        # -> com.example.userops::LogCumSumExp
    so = userops.session_options()                      # ORT: userops' and opbridge's ops, no torch

The ORT side needs no torch, and importing the package never imports it. ``userops.ops`` loads
the torch extension and registers the fake kernel from the declaration: on first use
(``userops.log_cumsum_exp``), or with the package in a process that has already imported torch.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # named for type checkers only: importing the package imports neither
    import onnxruntime
    from opbridge._decl import OpLibrary

NAMESPACE = "userops"  # CMakeLists.txt's NAMESPACE
DOMAIN = "com.example.userops"  # CMakeLists.txt's DOMAIN
_HERE = Path(__file__).resolve().parent


def get_library_path() -> str:
    """The ORT custom-op library with userops' ops (domain com.example.userops)."""
    return str(_HERE / "libuserops_ort.so")


def torch_library_path() -> str | None:
    path = _HERE / "libuserops_torch.so"
    return str(path) if path.is_file() else None


def library() -> OpLibrary:
    """userops' library, registered with opbridge (exports, `opbridge check`, opbridge.testing)."""
    from opbridge._decl import register_library

    return register_library(get_library_path(), namespace=NAMESPACE, torch_path=torch_library_path())


def session_options(so: onnxruntime.SessionOptions | None = None) -> onnxruntime.SessionOptions:
    """onnxruntime.SessionOptions with userops' and opbridge's ops registered."""
    import opbridge

    library()
    return opbridge.session_options(so)


# Torch only when used (as in opbridge); in a process that has already imported torch, with the
# package (so that torch.ops.userops.* exist for an export or torch.export.load).
if sys.modules.get("torch") is not None and torch_library_path() is not None:
    from . import ops  # noqa: F401


def __getattr__(name: str) -> Any:
    # The ops' Python functions (userops.<op>), from the torch side.
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    ops = importlib.import_module(".ops", __name__)
    if name == "ops":
        return ops
    try:
        return getattr(ops, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
