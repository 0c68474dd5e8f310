"""opbridge: custom neural-network operators written once in C++/CUDA that run the same in
PyTorch (``torch.ops.opbridge.*``) and ONNX Runtime (domain ``ai.opbridge``).

The ONNX Runtime side (``get_library_path``, ``session_options``, ``InferenceSession``) never
imports torch, even where torch is installed. The torch ops (``torch.ops.opbridge.*``) are
registered by ``import opbridge.ops`` (also ``opbridge.nn`` and ``opbridge.onnx``'s export
functions), and by ``import opbridge`` in a process that has already imported torch.
"""

from __future__ import annotations

import importlib
import sys
import types

from ._cmake import cmake_dir
from ._declarations import MisdeclaredOpError
from ._library import DOMAIN, build_info, get_library_path, torch_library_path
from ._op_library import OpLibrary, register_library
from ._op_package import op_package
from ._session import InferenceSession, session_options
from ._version import __version__

__all__ = [
    "DOMAIN",
    "InferenceSession",
    "MisdeclaredOpError",
    "OpLibrary",
    "__version__",
    "build_info",
    "cmake_dir",
    "get_library_path",
    "op_package",
    "register_library",
    "session_options",
    "nn",
    "ops",
    "onnx",
]

# Torch only when used: importing torch takes seconds, and a torch that does not match the one
# opbridge was built against must not break the ORT side. A process that has already imported
# torch gets the torch ops (e.g. for torch.export.load); a mismatch only warns here and raises
# where the torch ops are asked for (opbridge.ops).
if sys.modules.get("torch") is not None and torch_library_path() is not None:
    # When they cannot be registered (another torch version, an extension that does not load),
    # this only warns, so that the ONNX Runtime side stays usable; ``import opbridge.ops`` raises
    # the error where the torch ops are asked for.
    try:
        importlib.import_module(".ops", __name__)
    except ImportError as _e:
        import warnings

        warnings.warn(f"opbridge: torch ops not registered. {_e}", RuntimeWarning, stacklevel=2)
        del _e


def __getattr__(name: str) -> types.ModuleType:
    # nn / ops need torch (opbridge.onnx needs onnx; its export needs torch): import them on
    # first use so that a torch-free deployment can still `import opbridge`, and fail there with
    # the loader's helpful message.
    if name in ("nn", "onnx", "ops"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'opbridge' has no attribute {name!r}")
