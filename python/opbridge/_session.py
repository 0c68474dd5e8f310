"""ONNX Runtime helpers: register opbridge's custom-op library. Needs no torch."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from ._library import get_library_path
from ._ort import import_onnxruntime

if TYPE_CHECKING:  # neither is a dependency (docs/install.md); their types are named, not imported
    import onnx
    import onnxruntime


def session_options(so: onnxruntime.SessionOptions | None = None) -> onnxruntime.SessionOptions:
    """Returns ``so`` (or a new ``onnxruntime.SessionOptions``) with opbridge's ops registered,
    and those of the libraries registered with opbridge (``register_library``, or announced by
    installed packages and found by ``discover``)."""
    ort = import_onnxruntime()

    from ._op_library import registered

    if so is None:
        so = ort.SessionOptions()
    so.register_custom_ops_library(get_library_path())
    for lib in registered():
        so.register_custom_ops_library(lib.path)
    return so


def _check_model(model: Any) -> None:
    """For a model file: every tensor checked before ONNX Runtime reads any (external data inside
    the model's folder, offsets and lengths within its files: opbridge/onnx/_reader.py), an
    UnreadableModel (a ValueError) naming the file, the tensor and the reason otherwise. Then
    nodes of ops their library refuses as misdeclared (MisdeclaredOpError), and the nodes of
    declared ops that do not fit their op (``_declared_export.model_problems``: unknown attribute
    names, which ORT ignores silently; inputs, attributes and element types ORT would refuse in
    its own words; static shapes that already fail the op's checks, which ORT would fail only at
    run): an InvalidModel (a ValueError) naming them. Needs onnx; without it the checks are skipped."""
    try:
        import onnx
    except ImportError:
        return
    from .onnx import _reader
    from .onnx._declared_export import misdeclared_ops, model_problems

    if isinstance(model, (bytes, bytearray)):
        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception:  # unreadable: ONNX Runtime reports that in its own words
            return
    else:
        proto = _reader.read_graph(model)
        _reader.check(proto, model)
    error = misdeclared_ops(proto)
    if error is not None:
        raise error
    problems = model_problems(proto)
    if problems:
        raise _reader.InvalidModel(problems)


def InferenceSession(
    model: str | bytes | os.PathLike[str] | onnx.ModelProto,
    sess_options: onnxruntime.SessionOptions | None = None,
    providers: Sequence[str | tuple[str, dict[str, object]]] | None = None,
    **kwargs: object,
) -> onnxruntime.InferenceSession:
    """An ``onnxruntime.InferenceSession`` that can run ``ai.opbridge`` nodes.

    ``model`` is a path or serialized ModelProto bytes (an ``onnx.ModelProto`` is serialized
    for you). ``providers`` defaults to ``["CPUExecutionProvider"]``.
    """
    ort = import_onnxruntime()

    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    elif isinstance(model, os.PathLike):
        model = os.fspath(model)
    _check_model(model)
    return ort.InferenceSession(
        model,
        sess_options=session_options(sess_options),
        providers=list(providers) if providers is not None else ["CPUExecutionProvider"],
        **kwargs,
    )
