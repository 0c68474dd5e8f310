"""knn and three_nn on clouds large enough for the cell grid the CPU kernels search (a few
hundred points or more), with the inputs that make a grid search risky: ties across cells, points
exactly on cell borders, clustered clouds with outliers, flat clouds, queries far outside the
cloud, non-finite coordinates (the kernels scan those clouds instead), coordinates whose distances
overflow or underflow. Every result must equal the full scan's ranking: by squared distance
((dx * dx + dy * dy) + dz * dz, NaN as +inf), then by index.

References: float64 where every distance is exact (coordinates on a 1/16 lattice), else the
same formula in float32 numpy (each operation rounded on its own), both sorted stably."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from opbridge import ops


def ref_order(xyz, centers):
    """Per cloud: each center's point indices by (squared distance, index), and those distances;
    float64 math for float64 input, else float32 rounded step by step (the kernels' compute type)."""
    dt = np.float64 if xyz.dtype == torch.float64 else np.float32
    x = xyz.double().numpy().astype(dt)
    c = centers.double().numpy().astype(dt)
    out = []
    with np.errstate(all="ignore"):
        for b in range(x.shape[0]):
            d = c[b][:, None, :] - x[b][None, :, :]
            sq = (d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1]) + d[..., 2] * d[..., 2]
            sq = np.where(np.isnan(sq), np.inf, sq)
            order = np.argsort(sq, axis=1, kind="stable")
            out.append((order, np.take_along_axis(sq, order, axis=1)))
    return out


def check(k, xyz, centers):
    order = ref_order(xyz, centers)
    want = torch.from_numpy(np.stack([o[:, :k].T for o, _ in order]))
    assert torch.equal(ops.knn(k, xyz, centers), want)
    d, i = ops.three_nn(centers, xyz)
    assert torch.equal(i, torch.from_numpy(np.stack([o[:, :3] for o, _ in order])))
    want_d = torch.from_numpy(np.stack([np.sqrt(s[:, :3]) for _, s in order]))
    assert torch.equal(d, want_d.to(d.dtype))


def lattice(rng, *shape, step=1 / 16, span=32):
    return torch.from_numpy(rng.integers(-span, span + 1, size=(*shape, 3)) * step)


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_lattice_ties_and_cell_borders(rng, dtype):
    """Coordinates on a 1/16 lattice: duplicates, equal distances in neighbouring cells, points on
    cell borders; centers on points, between them and outside the cloud."""
    xyz = lattice(rng, 2, 700)
    centers = torch.cat([xyz[:, :50], lattice(rng, 2, 40), lattice(rng, 2, 10, span=200)], 1)
    centers[:, -5:] += 0.5 / 16  # between lattice planes
    for k in (1, 16, 87):
        check(k, xyz.to(dtype), centers.to(dtype))


def test_random_float32_and_float64(rng):
    xyz = torch.from_numpy(rng.uniform(-1, 1, (3, 1500, 3)))
    centers = torch.cat([xyz[:, :64], torch.from_numpy(rng.uniform(-3, 3, (3, 64, 3)))], 1)
    for dtype in (torch.float32, torch.float64):
        check(16, xyz.to(dtype), centers.to(dtype))


def test_clustered_cloud_with_outliers(rng):
    """Almost every point in one cell of a grid sized by the outliers' extent."""
    xyz = torch.from_numpy(rng.normal(0, 1e-3, (2, 600, 3)))
    xyz[:, ::97] = torch.from_numpy(rng.uniform(-1e3, 1e3, (2, 7, 3)))
    centers = torch.cat([xyz[:, :40], torch.from_numpy(rng.uniform(-1e3, 1e3, (2, 20, 3)))], 1)
    check(16, xyz.float(), centers.float())
    check(5, xyz, centers)


def test_flat_and_linear_clouds(rng):
    flat = lattice(rng, 1, 500)
    flat[..., 2] = 0.25
    line = torch.zeros(1, 500, 3, dtype=torch.float64)
    line[..., 1] = torch.from_numpy(rng.integers(0, 300, 500) / 8.0)
    for xyz in (flat, line):
        centers = torch.cat([xyz[:, :20], lattice(rng, 1, 20)], 1)
        check(16, xyz.float(), centers.float())


def test_equidistant_points(rng):
    """Every point at distance 1 from the origin (axis points, repeated): the k lowest indices."""
    axes = torch.tensor([[1.0, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]])
    xyz = axes[torch.from_numpy(rng.integers(0, 6, 600))][None]
    centers = torch.zeros(1, 3, 3)
    check(16, xyz, centers)
    assert torch.equal(ops.knn(16, xyz, centers)[0, :, 0], torch.arange(16))


def test_non_finite_coordinates(rng):
    """A NaN or inf anywhere in a cloud, or in a center."""
    xyz = lattice(rng, 3, 400).float()
    xyz[0, 17, 1] = float("nan")
    xyz[1, 250, 0] = float("inf")
    centers = lattice(rng, 3, 30).float()
    centers[2, 3, 2] = float("nan")
    centers[2, 4, 0] = float("-inf")
    check(16, xyz, centers)


def test_overflow_and_underflow(rng):
    """Distances that overflow float32 (+inf ties, lowest index first) or whose squares
    underflow (zero or subnormal ties)."""
    big = torch.from_numpy(rng.uniform(-1, 1, (1, 500, 3)) * 3e19).float()
    small = torch.from_numpy(rng.uniform(-1, 1, (1, 500, 3)) * 1e-22).float()
    for xyz in (big, small):
        centers = torch.cat([xyz[:, :10], -xyz[:, 10:20]], 1)
        check(16, xyz, centers)


def test_sizes_around_the_grid_threshold(rng):
    for n, k in ((127, 3), (128, 16), (129, 17), (800, 100), (800, 101), (5, 5)):
        xyz = lattice(rng, 2, n)
        check(k, xyz.float(), lattice(rng, 2, 9).float())


def test_empty_batches():
    assert ops.knn(3, torch.rand(0, 200, 3), torch.rand(0, 9, 3)).shape == (0, 3, 9)
    assert ops.knn(3, torch.rand(2, 200, 3), torch.rand(2, 0, 3)).shape == (2, 3, 0)
    d, i = ops.three_nn(torch.rand(2, 0, 3), torch.rand(2, 300, 3))
    assert d.shape == i.shape == (2, 0, 3)
