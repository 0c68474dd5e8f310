"""ONNX Runtime helpers: register opbridge's custom-op library. Needs no torch."""

from __future__ import annotations

import os
from typing import Any, Sequence

from ._library import get_library_path


def session_options(so: Any = None) -> Any:
    """Returns ``so`` (or a new ``onnxruntime.SessionOptions``) with opbridge's ops registered."""
    import onnxruntime as ort

    if so is None:
        so = ort.SessionOptions()
    so.register_custom_ops_library(get_library_path())
    return so


def InferenceSession(
    model: str | bytes | os.PathLike,
    sess_options: Any = None,
    providers: Sequence[Any] | None = None,
    **kwargs: Any,
) -> Any:
    """An ``onnxruntime.InferenceSession`` that can run ``ai.opbridge`` nodes.

    ``model`` is a path or serialized ModelProto bytes (an ``onnx.ModelProto`` is serialized
    for you). ``providers`` defaults to ``["CPUExecutionProvider"]``.
    """
    import onnxruntime as ort

    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    elif isinstance(model, os.PathLike):
        model = os.fspath(model)
    return ort.InferenceSession(
        model,
        sess_options=session_options(sess_options),
        providers=list(providers) if providers is not None else ["CPUExecutionProvider"],
        **kwargs,
    )
