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

from pathlib import Path

import opbridge

NAMESPACE = "userops"  # CMakeLists.txt's NAMESPACE
DOMAIN = "com.example.userops"  # CMakeLists.txt's DOMAIN
_HERE = Path(__file__).resolve().parent


def get_library_path() -> str:
    """The ORT custom-op library with userops' ops (domain com.example.userops)."""
    return str(_HERE / "libuserops_ort.so")


def torch_library_path() -> str | None:
    path = _HERE / "libuserops_torch.so"
    return str(path) if path.is_file() else None


# library(): userops' opbridge.OpLibrary; session_options(so=None): ORT session options with its ops
# and opbridge's; __getattr__: userops.<op> and userops.ops load the torch side on first use.
library, session_options, __getattr__ = opbridge.op_package(
    __name__, get_library_path(), namespace=NAMESPACE, torch_path=torch_library_path())
