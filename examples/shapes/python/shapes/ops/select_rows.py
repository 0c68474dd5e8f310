"""shapes::select_rows in torch: the Python function (the op has no gradient)."""

from __future__ import annotations

from typing import cast

import torch
from opbridge.ops import translate_errors

__all__ = ["select_rows"]


# translate_errors: the kernels' errors reach Python through the stable ABI as RuntimeError tagged
# with their type ("ValueError: shapes::select_rows: ..."); this function raises that type.
@translate_errors
def select_rows(x: torch.Tensor, threshold: float = 0.0) -> torch.Tensor:
    """The rows of x (N, D), float32/float64, whose largest element exceeds threshold, in order: (M, D),
    M decided by the values (under torch.export an unbacked size). No gradient. Exports to ONNX as
    com.example.shapes::SelectRows."""
    return cast(torch.Tensor, torch.ops.shapes.select_rows.default(x, threshold))
