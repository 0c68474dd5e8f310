"""shapes: custom ops on opbridge (one C++ kernel per op for PyTorch and ONNX Runtime).

ONNX Runtime (no torch needed)::

    sess = onnxruntime.InferenceSession("model.onnx", shapes.session_options())

torch: the first use of an op (``shapes.<op>(...)``, or ``import shapes.ops``) loads the torch
extension (``torch.ops.shapes.<op>``) and registers each op's fake kernel and autograd formula;
importing the package does so too in a process that has already imported torch, as importing
opbridge does for opbridge's ops. Importing the package alone never imports torch.
"""

from __future__ import annotations

import opbridge

from ._library import DOMAIN, NAMESPACE, get_library_path, library_spec, torch_library_path

__all__ = ["DOMAIN", "NAMESPACE", "get_library_path", "library", "library_spec", "session_options",
           "torch_library_path"]

# library(): the package's opbridge.OpLibrary; session_options(so=None): ORT session options with
# its ops and opbridge's; __getattr__: shapes.<op> and shapes.ops load the torch side on first use.
library, session_options, __getattr__ = opbridge.op_package(
    __name__, get_library_path(), namespace=NAMESPACE, torch_path=torch_library_path())
