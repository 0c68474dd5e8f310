"""Locating and loading opbridge's native libraries. Needs neither torch nor onnxruntime.

Part of the package's core layer (with _decl, _cmake, _version): it imports nothing of ops/,
onnx/ or the command line (tests/install/test_package_layers.py)."""

from __future__ import annotations

import functools
import importlib.resources
import os
import warnings
from pathlib import Path

ORT_LIBRARY = "libopbridge_ort.so"
TORCH_LIBRARY = "libopbridge_torch.so"
DOMAIN = "ai.opbridge"
"""The ONNX domain of opbridge's ops (the nodes torch's exporters write, the ops ONNX Runtime registers)."""
MS_DOMAIN = "com.microsoft"
"""ONNX Runtime's contrib-op domain (its GroupNorm, Inverse, QuickGelu: what exports and rewrites may target)."""


def _find(name: str) -> Path | None:
    # importlib.resources also sees binaries of an editable install, which live outside the
    # package directory.
    try:
        p = importlib.resources.files("opbridge") / name
        if p.is_file():
            return Path(str(p)).resolve()
    except (FileNotFoundError, TypeError):
        pass
    here = Path(__file__).resolve().parent / name
    return here if here.is_file() else None


def get_library_path() -> str:
    """Absolute path of the ONNX Runtime custom-op library (register it with
    ``SessionOptions.register_custom_ops_library``)."""
    p = _find(ORT_LIBRARY)
    if p is None:
        raise FileNotFoundError(
            f"opbridge: {ORT_LIBRARY} is not installed next to the opbridge package; "
            "reinstall opbridge (pip install --no-build-isolation .)"
        )
    return str(p)


def torch_library_path() -> str | None:
    p = _find(TORCH_LIBRARY)
    return None if p is None else str(p)


class TorchVersionError(ImportError):
    """The installed torch is older than the oldest release opbridge's torch extension supports."""


# The torch extension is built on the LibTorch stable ABI of torch 2.11 (TORCH_TARGET_VERSION):
# one binary that loads into every torch from 2.11 on. TORCH_TESTED is the newest release it was
# tested with (CI runs 2.11, 2.13 and 2.14); a newer one works and warns once.
TORCH_MIN = (2, 11)
TORCH_TESTED = (2, 14)
TORCH_FASTPATH_LIBRARY = "libopbridge_torch_fastpath.so"


def _public(version: str) -> str:
    # "2.13.0+cpu" and "2.13.0+cu130" are one torch release (one C++ API); the local label only
    # says which accelerator build it is.
    return version.split("+", 1)[0]


def _release(version: str) -> tuple[int, int]:
    parts = _public(version).split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def check_torch_version(torch_version: str) -> None:
    """Raises TorchVersionError for a torch older than TORCH_MIN; warns (once) for one newer than
    TORCH_TESTED, which the stable ABI lets the extension load into untested."""
    release = _release(torch_version)
    minimum = ".".join(map(str, TORCH_MIN))
    if release < TORCH_MIN:
        raise TorchVersionError(
            f"opbridge {_version()}'s torch ops need torch>={minimum}, but this process imports torch "
            f"{torch_version}; the extension is built on the LibTorch stable ABI of torch {minimum} and "
            f"loads into every torch from {minimum} on. Fix: pip install 'torch>={minimum}'. The ONNX "
            f"Runtime side (get_library_path, session_options, InferenceSession) works regardless."
        )
    if release > TORCH_TESTED:
        _warn_untested(torch_version)


@functools.lru_cache(maxsize=None)
def _warn_untested(torch_version: str) -> None:
    tested = ".".join(map(str, TORCH_TESTED))
    warnings.warn(
        f"opbridge {_version()} was tested with torch {'.'.join(map(str, TORCH_MIN))} to {tested}; this "
        f"process imports torch {torch_version}. Its torch ops load through the stable ABI and should work; "
        "please report anything that does not.",
        RuntimeWarning,
        stacklevel=3,
    )


def _version() -> str:
    from ._version import __version__

    return __version__


@functools.lru_cache(maxsize=None)
def load_torch_library() -> None:
    """Loads the torch extension so that torch.ops.opbridge.* exist, and where the running torch is
    the one it was built with, the optional fast-path library. Idempotent."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised in torch-free environments
        raise ImportError(
            f"opbridge's torch ops need PyTorch; install torch>={'.'.join(map(str, TORCH_MIN))}. The ONNX "
            "Runtime side (get_library_path, session_options, InferenceSession) works without it."
        ) from e
    path = torch_library_path()
    if path is None:
        raise ImportError(
            f"opbridge: {TORCH_LIBRARY} is missing: this opbridge was built without the torch "
            "extension (OPBRIDGE_WITH_TORCH=OFF or torch was not importable at build time)"
        )
    # Before loading: an older torch lacks parts of the stable ABI the library uses.
    check_torch_version(torch.__version__)
    try:
        torch.ops.load_library(path)
    except OSError as e:
        raise ImportError(
            f"opbridge: could not load {path} into torch {torch.__version__}. Loader said: {e}"
        ) from e
    load_fastpath_library(torch.__version__)


def fastpath_library_path(torch_version: str) -> str | None:
    """The optional fast-path library (libtorch's C++ API: the no-grad fast path and the C++
    autograd graph, cpp/torch/autograd_kernel_torch.cpp) where it exists and was built against
    this torch release, else None (then the Python autograd formulas serve every call)."""
    if os.environ.get("OPBRIDGE_NO_FASTPATH"):
        return None
    p = _find(TORCH_FASTPATH_LIBRARY)
    built = str(build_info().get("torch_version", ""))
    if p is None or not built or _public(built) != _public(torch_version):
        return None
    return str(p)


def load_fastpath_library(torch_version: str) -> bool:
    """Loads the fast-path library where fastpath_library_path finds one; whether it is loaded."""
    path = fastpath_library_path(torch_version)
    if path is None:
        return False
    import torch

    try:
        torch.ops.load_library(path)
    except OSError as e:
        warnings.warn(f"opbridge: the fast-path library did not load ({e}); the Python autograd formulas serve "
                      "every call", RuntimeWarning, stacklevel=2)
        return False
    return True


def build_info() -> dict[str, str | int | bool]:
    """Build information of the native code (versions, CUDA), from opbridge._core."""
    try:
        from . import _core
    except ImportError:
        return {}
    return dict(_core.build_info)
