"""opbridge.ops point-cloud ops (PointNet++ and the 3-D detectors built on it) as torch custom ops
with fake kernels and autograd, under mmcv's names, argument orders and semantics
(``mmcv.ops``), so that code calling mmcv's functions switches by changing its import.

Differences from mmcv (docs/point_cloud.md): indices are int64 (mmcv returns int32; int32 indices
are accepted as inputs); ties go to the lowest index in every kernel, so indices compare exactly
between CPU, CUDA and ONNX Runtime; a NaN distance counts as +infinity, so no index is ever out of
range; bad input (k > N, an index out of range, radius <= 0, an empty cloud) is an error naming
the argument. ``three_interpolate`` also gives the gradient of ``weight``. The ``*_batch_cnt``
(stacked) variants are not provided.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from ._errors import raise_translated

__all__ = ["ball_query", "furthest_point_sample", "gather_points", "grouping_operation", "knn", "three_interpolate",
           "three_nn"]

_ops = torch.ops.opbridge


def _call(op: Any, *args: Any) -> Any:
    try:
        return op(*args)
    except RuntimeError as e:
        raise_translated(e)
        raise


def furthest_point_sample(points_xyz: torch.Tensor, num_points: int) -> torch.Tensor:
    """Farthest point sampling: ``num_points`` indices (int64, ``(B, num_points)``) into the
    ``N`` points of each cloud ``points_xyz`` ``(B, N, 3)``. The first index is 0; each next one
    is the point whose distance to the points picked so far is the largest (ties: the lowest
    index). ``num_points <= N``. O(N) extra memory per cloud. Exports to
    ``ai.opbridge::FurthestPointSample``."""
    return cast(torch.Tensor, _call(_ops.furthest_point_sample.default, points_xyz, num_points))


def gather_points(features: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``out[b, c, m] = features[b, c, indices[b, m]]``: features ``(B, C, N)``, indices
    ``(B, M)`` int64 or int32 in ``[0, N)`` -> ``(B, C, M)``. Differentiable in ``features``.
    Exports to ``ai.opbridge::GatherPoints``."""
    return cast(torch.Tensor, _call(_ops.gather_points.default, features, indices))


def ball_query(min_radius: float, max_radius: float, sample_num: int, xyz: torch.Tensor,
               center_xyz: torch.Tensor) -> torch.Tensor:
    """Ball query: for each center of ``center_xyz`` ``(B, M, 3)``, the first ``sample_num``
    points of ``xyz`` ``(B, N, 3)`` (in index order) at a distance ``d`` with
    ``min_radius <= d < max_radius`` or ``d == 0``; unfilled slots repeat the first point found,
    a center with none gets zeros (PointNet++'s rule). Returns ``(B, M, sample_num)`` int64.
    ``0 <= min_radius < max_radius``; the radii are used as float32 (as ONNX stores them).
    Exports to ``ai.opbridge::BallQuery``."""
    return cast(torch.Tensor, _call(_ops.ball_query.default, float(min_radius), float(max_radius), int(sample_num), xyz,
                                    center_xyz))


def knn(k: int, xyz: torch.Tensor, center_xyz: torch.Tensor | None = None, transposed: bool = False) -> torch.Tensor:
    """The ``k`` nearest points of ``xyz`` ``(B, N, 3)`` to each center of ``center_xyz``
    ``(B, M, 3)`` (default: ``xyz`` itself), nearest first: ``(B, k, M)`` int64 indices into
    ``N`` (ties: the lowest index). ``transposed=True``: both clouds are ``(B, 3, *)``.
    ``1 <= k <= N``. Exports to ``ai.opbridge::KNN``."""
    if center_xyz is None:
        center_xyz = xyz
    if transposed:
        xyz = xyz.transpose(1, 2)
        center_xyz = center_xyz.transpose(1, 2)
    return cast(torch.Tensor, _call(_ops.knn.default, int(k), xyz, center_xyz))


def grouping_operation(features: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``out[b, c, m, s] = features[b, c, indices[b, m, s]]``: features ``(B, C, N)``, indices
    ``(B, M, S)`` int64 or int32 in ``[0, N)`` (as ``ball_query`` gives) -> ``(B, C, M, S)``.
    Differentiable in ``features``. Exports to ``ai.opbridge::GroupingOperation``."""
    return cast(torch.Tensor, _call(_ops.grouping_operation.default, features, indices))


def three_nn(target: torch.Tensor, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The three nearest points of ``source`` ``(B, M, 3)``, ``M >= 3``, to each point of
    ``target`` ``(B, N, 3)``: ``(dist, indices)``, both ``(B, N, 3)``, the Euclidean distances
    ascending and their int64 indices into ``M`` (ties: the lowest index). Not differentiable
    (as in mmcv). Exports to ``ai.opbridge::ThreeNN``."""
    dist, idx = _call(_ops.three_nn.default, target, source)
    return dist, idx


def three_interpolate(features: torch.Tensor, indices: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``out[b, c, n] = sum_j weight[b, n, j] * features[b, c, indices[b, n, j]]``: features
    ``(B, C, M)``, indices ``(B, N, 3)`` int64 or int32 in ``[0, M)``, weight ``(B, N, 3)`` ->
    ``(B, C, N)``. Differentiable in ``features`` and ``weight``. Exports to
    ``ai.opbridge::ThreeInterpolate``."""
    return cast(torch.Tensor, _call(_ops.three_interpolate.default, features, indices, weight))


# Fake kernels and first-order autograd come from the declarations (ops/<op>/<op>_decl.cpp;
# ops/_torch_adapter.py).
