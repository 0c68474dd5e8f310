"""The optional packages opbridge imports where they are needed, and what to install when one is
missing. ONNX Runtime is never a dependency of opbridge: two distributions (``onnxruntime``, CPU;
``onnxruntime-gpu``, CUDA) install the same ``onnxruntime`` module, and depending on one would make
pip install it over the other. Needs no torch."""

from __future__ import annotations

from typing import Any

ORT_HINT = ('install one of its two distributions: pip install "opbridge[onnxruntime]" (CPU) or '
            'pip install "opbridge[onnxruntime-gpu]" (CUDA)')
TOOLS_HINT = 'pip install "opbridge[tools]" (onnx, onnxscript and onnx-ir; no torch)'
# Module names of the packages the `tools` extra installs.
_TOOLS = ("onnx", "onnxscript", "onnx_ir")


def import_onnxruntime() -> Any:
    """The ``onnxruntime`` module; a ModuleNotFoundError naming both extras where none is installed.
    An onnxruntime that is installed but fails to import raises its own error unchanged."""
    try:
        import onnxruntime
    except ModuleNotFoundError as e:
        if e.name != "onnxruntime":
            raise
        raise ModuleNotFoundError(f"opbridge needs ONNX Runtime here, which is not installed; {ORT_HINT}",
                                  name="onnxruntime") from None
    return onnxruntime


def missing_message(command: str, e: ImportError) -> str:
    """One line for a command that could not import what it needs: what to install."""
    name = getattr(e, "name", None) or ""
    if name == "onnxruntime":
        return f"opbridge {command} needs ONNX Runtime, which is not installed; {ORT_HINT}"
    if isinstance(e, ModuleNotFoundError) and name in _TOOLS:
        return f"opbridge {command} needs onnx, onnxscript and onnx-ir ({name} is not installed): {TOOLS_HINT}"
    if name.partition(".")[0] in _TOOLS:  # installed, but older than the `tools` extra's floors
        return f'opbridge {command}: {e}; upgrade to the versions it needs: pip install -U "opbridge[tools]"'
    return f"opbridge {command}: {e}"
