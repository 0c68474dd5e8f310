"""PointNet++ models over the point-cloud ops, end to end.

- An MSG segmentation head (multi-scale grouping set abstractions, feature propagation through
  three_nn / three_interpolate; random init): torch -> ONNX (dynamic batch and point count) ->
  ONNX Runtime, equal to torch.
- The same model written against mmcv's function names (``mmcv.ops``), run once on opbridge.ops
  and once on MmcvReference below: mmcv's semantics re-implemented in plain PyTorch, float64,
  from mmcv's documented behaviour (int32 indices, ball query's fill rule), independently of
  opbridge's kernels. Where mmcv itself imports, it runs too.
"""

from __future__ import annotations

import importlib.util
import itertools
import time
import types

import numpy as np
import opbridge
import pytest
import torch
from opbridge import ops as opbridge_ops

# ---- mmcv's semantics in plain PyTorch (float64) -------------------------------------------------


def _sq_dist(a, b):
    """(B, P, 3), (B, Q, 3) -> (B, P, Q) squared distances in float64; NaN counts as +inf."""
    d = a.double()[:, :, None, :] - b.double()[:, None, :, :]
    return (d * d).sum(-1).nan_to_num(nan=float("inf"))


def _fps(points_xyz, num_points):
    B, N, _ = points_xyz.shape
    out = torch.zeros(B, num_points, dtype=torch.int32)
    for b in range(B):
        temp = torch.full((N,), 1e10, dtype=torch.float64)  # mmcv's initial distance
        last = 0
        for j in range(1, num_points):
            temp = torch.minimum(temp, _sq_dist(points_xyz[b:b + 1, last:last + 1], points_xyz[b:b + 1])[0, 0])
            last = int(torch.argmax(temp))
            out[b, j] = last
    return out


def _gather_points(features, indices):
    idx = indices.long()
    return torch.gather(features, 2, idx[:, None, :].expand(-1, features.shape[1], -1))


def _ball_query(min_radius, max_radius, sample_num, xyz, center_xyz):
    d = _sq_dist(center_xyz, xyz)
    inside = (d == 0) | ((d >= min_radius**2) & (d < max_radius**2))
    out = torch.zeros(*center_xyz.shape[:2], sample_num, dtype=torch.int32)
    for b in range(d.shape[0]):
        for m in range(d.shape[1]):
            hits = torch.nonzero(inside[b, m]).flatten()[:sample_num]
            if len(hits):  # unfilled slots repeat the first point found; none found: zeros
                out[b, m] = hits[0]
                out[b, m, :len(hits)] = hits
    return out


def _knn(k, xyz, center_xyz=None, transposed=False):
    if center_xyz is None:
        center_xyz = xyz
    if transposed:
        xyz, center_xyz = xyz.transpose(1, 2), center_xyz.transpose(1, 2)
    idx = torch.sort(_sq_dist(center_xyz, xyz), dim=2, stable=True).indices[:, :, :k]
    return idx.transpose(1, 2).contiguous().int()  # (B, k, M)


def _grouping_operation(features, indices):
    B, C, _ = features.shape
    idx = indices.long()
    flat = torch.gather(features, 2, idx.reshape(B, 1, -1).expand(-1, C, -1))
    return flat.reshape(B, C, *idx.shape[1:])


def _three_nn(target, source):
    d = torch.sort(_sq_dist(target, source), dim=2, stable=True)
    return d.values[..., :3].sqrt(), d.indices[..., :3].int()


def _three_interpolate(features, indices, weight):
    g = _grouping_operation(features, indices)  # (B, C, N, 3)
    return (g * weight[:, None].to(g.dtype)).sum(-1)


MmcvReference = types.SimpleNamespace(
    furthest_point_sample=_fps, gather_points=_gather_points, ball_query=_ball_query, knn=_knn,
    grouping_operation=_grouping_operation, three_nn=_three_nn, three_interpolate=_three_interpolate)


# ---- a PointNet++ MSG segmentation head, written against mmcv's function names ---------------------


def _mlp2d(channels):
    layers = []
    for a, b in itertools.pairwise(channels):
        layers += [torch.nn.Conv2d(a, b, 1), torch.nn.BatchNorm2d(b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


class MSGSetAbstraction(torch.nn.Module):
    """Multi-scale grouping (mmdet3d's PointSAModuleMSG): one FPS, one ball query and MLP per
    radius, max-pooled and concatenated."""

    def __init__(self, ops, npoint, radii, nsamples, in_channels, mlps):
        super().__init__()
        self.ops, self.npoint, self.radii, self.nsamples = ops, npoint, radii, nsamples
        self.mlps = torch.nn.ModuleList(_mlp2d([in_channels + 3] + list(m)) for m in mlps)

    def forward(self, xyz, features):
        ops = self.ops
        xyz_t = xyz.transpose(1, 2).contiguous()
        centers = ops.gather_points(xyz_t, ops.furthest_point_sample(xyz, self.npoint))  # (B, 3, npoint)
        new_xyz = centers.transpose(1, 2).contiguous()
        scales = []
        for radius, nsample, mlp in zip(self.radii, self.nsamples, self.mlps):
            idx = ops.ball_query(0.0, radius, nsample, xyz, new_xyz)
            grouped = ops.grouping_operation(xyz_t, idx) - centers.unsqueeze(-1)
            if features is not None:
                grouped = torch.cat([grouped, ops.grouping_operation(features, idx)], dim=1)
            scales.append(mlp(grouped).max(dim=-1).values)
        return new_xyz, torch.cat(scales, dim=1)


class FeaturePropagation(torch.nn.Module):
    """mmdet3d's PointFPModule: inverse-distance weights over the three nearest known points."""

    def __init__(self, ops, channels):
        super().__init__()
        self.ops = ops
        layers = []
        for a, b in itertools.pairwise(channels):
            layers += [torch.nn.Conv1d(a, b, 1), torch.nn.BatchNorm1d(b), torch.nn.ReLU()]
        self.mlp = torch.nn.Sequential(*layers)

    def forward(self, xyz, known_xyz, skip, known_features):
        dist, idx = self.ops.three_nn(xyz, known_xyz)
        dist_recip = 1.0 / (dist + 1e-8)
        weight = dist_recip / dist_recip.sum(dim=2, keepdim=True)
        up = self.ops.three_interpolate(known_features, idx, weight)
        return self.mlp(torch.cat([up, skip], dim=1) if skip is not None else up)


class PointNet2MSGSeg(torch.nn.Module):
    """Two MSG set abstractions, three feature propagations back to every input point, a per-point
    classifier; plus a kNN-grouped edge feature on the coarsest level."""

    def __init__(self, ops, num_classes=6, in_features=1):
        super().__init__()
        self.ops = ops
        self.sa1 = MSGSetAbstraction(ops, 32, [0.2, 0.4], [8, 16], in_features, [[16, 16], [16, 32]])
        self.sa2 = MSGSetAbstraction(ops, 8, [0.4, 0.8], [8, 8], 48, [[32, 32], [32, 32]])
        self.fp2 = FeaturePropagation(ops, [64 + 48, 48])
        self.fp1 = FeaturePropagation(ops, [48 + in_features, 32])
        self.head = torch.nn.Conv1d(32 + 64, num_classes, 1)

    def forward(self, xyz, features):
        xyz1, f1 = self.sa1(xyz, features)
        xyz2, f2 = self.sa2(xyz1, f1)
        edge = self.ops.grouping_operation(f2, self.ops.knn(3, xyz2).transpose(1, 2).contiguous()).mean(-1)
        f1 = self.fp2(xyz1, xyz2, f1, f2 + edge)
        per_point = self.fp1(xyz, xyz1, features, f1)
        context = f2.max(dim=-1, keepdim=True).values.expand(-1, -1, per_point.shape[-1])
        return self.head(torch.cat([per_point, context], dim=1))


def _model(ops, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    model = PointNet2MSGSeg(ops).to(dtype).eval()
    # Random running statistics, so that the normalizations are not the identity.
    for m in model.modules():
        if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return model


def _inputs(rng, b, n, dtype=np.float32):
    return rng.uniform(-1, 1, (b, n, 3)).astype(dtype), rng.standard_normal((b, 1, n)).astype(dtype)


def _export(model, path, dynamo, example):
    if dynamo:
        dims = {"xyz": {0: torch.export.Dim("batch"), 1: torch.export.Dim("points", min=32)},
                "features": {0: torch.export.Dim("batch"), 2: torch.export.Dim("points", min=32)}}
        # optimize=False: onnxscript's optimizer (0.7.2) folds `dist + 1e-8` to `dist`
        # (docs/point_cloud.md, Export).
        opbridge.onnx.export(model, example, path, dynamo=True, dynamic_shapes=dims,
                             input_names=["xyz", "features"], output_names=["scores"], optimize=False)
    else:
        opbridge.onnx.export(model, example, path, dynamo=False, input_names=["xyz", "features"],
                             output_names=["scores"],
                             dynamic_axes={"xyz": {0: "batch", 1: "points"}, "features": {0: "batch", 2: "points"}})


EXPORTERS = [pytest.param(False, id="torchscript"), pytest.param(True, id="dynamo", marks=pytest.mark.slow)]


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_msg_segmentation_head_in_onnxruntime(tmp_path, rng, dynamo):
    """Exported once, run in ONNX Runtime on other batch sizes and point counts than the example's,
    equal to torch (the indices inside are exact, so only float rounding differs)."""
    model = _model(opbridge_ops)
    xyz, feats = _inputs(rng, 2, 64)
    path = tmp_path / "pointnet2_msg_seg.onnx"
    t0 = time.perf_counter()
    _export(model, path, dynamo, (torch.from_numpy(xyz), torch.from_numpy(feats)))
    print(f"export ({'dynamo' if dynamo else 'torchscript'}): {time.perf_counter() - t0:.1f} s")
    sess = opbridge.InferenceSession(str(path))
    for b, n in [(2, 64), (1, 150), (3, 40)]:
        xyz, feats = _inputs(rng, b, n)
        with torch.no_grad():
            want = model(torch.from_numpy(xyz), torch.from_numpy(feats)).numpy()
        (got,) = sess.run(None, {"xyz": xyz, "features": feats})
        assert got.shape == want.shape == (b, 6, n)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# ---- code written against mmcv's functions: opbridge.ops against mmcv's semantics ------------------


HAS_MMCV = importlib.util.find_spec("mmcv") is not None


def _mmcv_ops():
    mmcv_ops = pytest.importorskip("mmcv.ops")
    return mmcv_ops


BACKENDS = ["reference", pytest.param("mmcv", marks=pytest.mark.skipif(
    not HAS_MMCV, reason="mmcv does not install here (PyPI has only its source, which compiles against torch)"))]


@pytest.mark.parametrize("against", BACKENDS)
def test_mmcv_code_switches_by_import(rng, against):
    """The same PointNet++ (the same weights) on opbridge.ops and on mmcv's semantics gives the same
    scores, float64; every op on its own too, mmcv's int32 indices fed to opbridge's ops."""
    other = MmcvReference if against == "reference" else _mmcv_ops()
    xyz, feats = (torch.from_numpy(a) for a in _inputs(rng, 2, 96, np.float64))
    with torch.no_grad():
        got = _model(opbridge_ops, dtype=torch.float64)(xyz, feats)
        want = _model(other, dtype=torch.float64)(xyz, feats)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)

    centers_idx = opbridge_ops.furthest_point_sample(xyz, 16)
    their_idx = other.furthest_point_sample(xyz, 16)
    assert centers_idx.dtype == torch.int64 and their_idx.dtype == torch.int32
    assert torch.equal(centers_idx, their_idx.long())
    centers = opbridge_ops.gather_points(xyz.transpose(1, 2).contiguous(), their_idx)  # int32 accepted
    torch.testing.assert_close(centers, other.gather_points(xyz.transpose(1, 2).contiguous(), their_idx))
    new_xyz = centers.transpose(1, 2).contiguous()
    for args in [(0.0, 0.3, 8), (0.1, 0.5, 5)]:
        theirs = other.ball_query(*args, xyz, new_xyz)
        assert torch.equal(opbridge_ops.ball_query(*args, xyz, new_xyz), theirs.long())
        torch.testing.assert_close(opbridge_ops.grouping_operation(feats, theirs),
                                   other.grouping_operation(feats, theirs))
    for kwargs in [{}, {"center_xyz": new_xyz}]:
        assert torch.equal(opbridge_ops.knn(5, xyz, **kwargs), other.knn(5, xyz, **kwargs).long())
    assert torch.equal(opbridge_ops.knn(5, xyz.transpose(1, 2), transposed=True),
                       other.knn(5, xyz.transpose(1, 2), transposed=True).long())
    dist, idx = opbridge_ops.three_nn(xyz, new_xyz)
    their_dist, their_nn = other.three_nn(xyz, new_xyz)
    assert torch.equal(idx, their_nn.long())
    torch.testing.assert_close(dist, their_dist)
    weight = torch.from_numpy(rng.uniform(0.1, 1, their_nn.shape))
    torch.testing.assert_close(opbridge_ops.three_interpolate(feats[:, :, :16], their_nn, weight),
                               other.three_interpolate(feats[:, :, :16], their_nn, weight))
