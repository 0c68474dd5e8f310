"""Locating and loading opbridge's native libraries. Needs neither torch nor onnxruntime."""

from __future__ import annotations

import functools
import importlib.resources
import os
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
    built = build_info().get("torch_version", "")
    try:
        torch.ops.load_library(path)
    except OSError as e:
        raise ImportError(
            f"opbridge: could not load {path} into torch {torch.__version__}; it was built "
            f"against torch {built or 'unknown'}. Rebuild opbridge against the installed torch "
            f"(pip install --no-build-isolation --force-reinstall .). Loader said: {e}"
        ) from e


def build_info() -> dict:
    """Build information of the native code (versions, CUDA), from opbridge._core."""
    try:
        from . import _core
    except ImportError:
        return {}
    return dict(_core.build_info)
