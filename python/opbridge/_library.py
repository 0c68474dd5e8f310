"""Locating and loading opbridge's native libraries. Needs neither torch nor onnxruntime."""

from __future__ import annotations

import functools
import importlib
import importlib.resources
import os
import warnings
from pathlib import Path

ORT_LIBRARY = "libopbridge_ort.so"
TORCH_LIBRARY = "libopbridge_torch.so"
DOMAIN = "ai.opbridge"


def _find(name: str) -> Path | None:
    # importlib.resources also sees binaries of an editable install, which live outside the
    # package directory.
    try:
        p = importlib.resources.files("opbridge") / name
        if p.is_file():
            return Path(os.fspath(p)).resolve()
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
    """The installed torch is not the version opbridge's torch extension was built against."""


def _public(version: str) -> str:
    # "2.13.0+cpu" and "2.13.0+cu130" are one torch release (one C++ API); the local label only
    # says which accelerator build it is.
    return version.split("+", 1)[0]


def check_torch_version(torch_version: str) -> None:
    """Raises TorchVersionError unless ``torch_version`` is the torch release the extension was
    built against (the exact ``torch==`` requirement of the wheel's ``export`` extra)."""
    built = build_info().get("torch_version", "")
    if not built or _public(built) == _public(torch_version):
        return
    raise TorchVersionError(
        f"opbridge {_version()}'s torch ops were built against torch {built}, but this process "
        f"imports torch {torch_version}; a torch extension only loads into the torch release it was "
        f"compiled for. Fix: install that torch (pip install torch=={_public(built)}), or rebuild "
        f"opbridge against this one (from its source: pip install --no-build-isolation "
        f"--force-reinstall --no-deps .). The ONNX Runtime side (get_library_path, "
        f"session_options, InferenceSession) works regardless."
    )


def _version() -> str:
    from ._version import __version__

    return __version__


@functools.lru_cache(maxsize=None)
def load_torch_library() -> None:
    """Loads the torch extension so that torch.ops.opbridge.* exist. Idempotent."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised in torch-free environments
        raise ImportError(
            "opbridge's torch ops need PyTorch; install torch (the version opbridge was built "
            "against, see `opbridge info`). The ONNX Runtime side (get_library_path, "
            "session_options, InferenceSession) works without it."
        ) from e
    path = torch_library_path()
    if path is None:
        raise ImportError(
            f"opbridge: {TORCH_LIBRARY} is missing: this opbridge was built without the torch "
            "extension (OPBRIDGE_WITH_TORCH=OFF or torch was not importable at build time)"
        )
    # Before loading: a library built for another torch fails with an undefined symbol at best,
    # and misbehaves at worst.
    check_torch_version(torch.__version__)
    built = build_info().get("torch_version", "")
    try:
        torch.ops.load_library(path)
    except OSError as e:
        raise ImportError(
            f"opbridge: could not load {path} into torch {torch.__version__}; it was built "
            f"against torch {built or 'unknown'}. Rebuild opbridge against the installed torch "
            f"(pip install --no-build-isolation --force-reinstall .). Loader said: {e}"
        ) from e


def register_torch_ops_if_compatible() -> None:
    """``import opbridge`` in a process that has already imported torch: registers the torch ops
    (import opbridge.ops). When they cannot be registered (another torch version, an extension
    that does not load), this only warns, so that the ONNX Runtime side stays usable;
    ``import opbridge.ops`` raises the error where the torch ops are asked for."""
    try:
        importlib.import_module("opbridge.ops")
    except ImportError as e:
        warnings.warn(f"opbridge: torch ops not registered. {e}", RuntimeWarning, stacklevel=2)


def build_info() -> dict:
    """Build information of the native code (versions, CUDA), from opbridge._core."""
    try:
        from . import _core
    except ImportError:
        return {}
    return dict(_core.build_info)
