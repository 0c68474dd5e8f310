"""opbridge: custom neural-network operators written once in C++/CUDA that run the same in
PyTorch (``torch.ops.opbridge.*``) and ONNX Runtime (domain ``ai.opbridge``).

The ONNX Runtime side (``get_library_path``, ``session_options``, ``InferenceSession``) works
without torch. Where torch is installed, importing opbridge registers the torch ops.
"""

from __future__ import annotations

import importlib
import importlib.util

from ._cmake import cmake_dir
from ._library import DOMAIN, build_info, get_library_path
from ._session import InferenceSession, session_options
from ._version import __version__

__all__ = [
    "DOMAIN",
    "InferenceSession",
    "__version__",
    "build_info",
    "cmake_dir",
    "get_library_path",
    "session_options",
    "nn",
    "ops",
    "onnx",
]

if importlib.util.find_spec("torch") is not None:
    from . import ops  # noqa: F401  (registers torch.ops.opbridge.*)


def __getattr__(name: str):
    # nn / ops need torch (opbridge.onnx needs onnx; its export needs torch): import them on
    # first use so that a torch-free deployment can still `import opbridge`, and fail there with
    # the loader's helpful message.
    if name in ("nn", "onnx", "ops"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'opbridge' has no attribute {name!r}")
