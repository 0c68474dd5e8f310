"""index_ops::radius_neighbors in torch: the Python function (int64 indices: no gradient)."""

from __future__ import annotations

from typing import cast

import torch
from opbridge.ops import translate_errors

__all__ = ["radius_neighbors"]


# translate_errors: the kernels' errors reach Python through the stable ABI as RuntimeError tagged
# with their type ("ValueError: index_ops::radius_neighbors: ..."); this function raises that type.
@translate_errors
def radius_neighbors(points: torch.Tensor, queries: torch.Tensor, radius: float, k: int) -> torch.Tensor:
    """For each of queries (M, D), the first k of points (N, D) (float32/float64, in index order) at a
    distance < radius (used as float32, as ONNX stores it): (M, k) int64, -1 where fewer.
    Exports to ONNX as com.example.index_ops::RadiusNeighbors."""
    return cast(torch.Tensor, torch.ops.index_ops.radius_neighbors.default(points, queries, radius, k))
