"""Where myops's libraries are, and what its ``opbridge.libraries`` entry point announces.

Imports neither torch nor opbridge: ``opbridge check`` imports this module (and the package's
``__init__``, which is torch-free too) to find the ONNX Runtime library.
"""

from __future__ import annotations

import importlib.resources
from typing import Any

NAMESPACE = "myops"  # torch.ops.myops.*: CMakeLists.txt's NAMESPACE
DOMAIN = "com.example.myops"  # the ONNX domain of the ops: CMakeLists.txt's DOMAIN


def _file(name: str) -> Any:
    # importlib.resources rather than __file__: also right for editable installs.
    return importlib.resources.files(__package__) / name


def get_library_path() -> str:
    """The ONNX Runtime custom-op library with this package's ops (domain com.example.myops)."""
    return str(_file("libmyops_ort.so"))


def torch_library_path() -> str | None:
    """The torch extension (None where it was not built)."""
    path = _file("libmyops_torch.so")
    return str(path) if path.is_file() else None


def library_spec() -> dict[str, str | None]:
    """What the ``opbridge.libraries`` entry point announces."""
    return {"ort": get_library_path(), "namespace": NAMESPACE, "torch": torch_library_path()}
