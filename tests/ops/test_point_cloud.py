"""Point-cloud ops (furthest_point_sample, gather_points, ball_query, grouping_operation, knn,
three_nn, three_interpolate): against float64 references written here (plain loops over torch
tensors), through opbridge.testing.check_op (torch op, fake kernel, gradients, both exporters, ONNX
Runtime, opbridge._core), with bad input refused alike by torch, the fake kernel, ONNX Runtime and
_core.

Point coordinates are multiples of 1/16 in [-2, 2]: every squared distance is then exact in each
dtype's compute type (float for the 16-bit types), so indices compare exactly with the reference,
and the grid makes ties common, which tests the lowest-index rule."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import opbridge
import pytest
import torch
from helpers.point_cloud_cases import BAD, BAD_IDS, single_node_model
from opbridge import ops
from opbridge.testing import check_op


def grid_points(rng, *shape):
    return torch.from_numpy(rng.integers(-32, 33, size=(*shape, 3)) / 16.0)


def sq_dist(a, b):
    """Squared distances [..., len(a), len(b)] in float64, element by element."""
    d = a[:, None, :] - b[None, :, :]
    return (d * d).sum(-1)


# ---- float64 references ---------------------------------------------------------------------


def ref_fps(xyz, m):
    out = torch.zeros(xyz.shape[0], m, dtype=torch.int64)
    for b in range(xyz.shape[0]):
        pts = xyz[b].double()
        best = torch.full((pts.shape[0],), float("inf"), dtype=torch.float64)
        last = 0
        for j in range(1, m):
            best = torch.minimum(best, sq_dist(pts[last:last + 1], pts)[0].nan_to_num(nan=float("inf")))
            last = int(torch.argmax(best))  # the first maximum
            out[b, j] = last
    return out


def ref_ball_query(min_r, max_r, s, xyz, centers):
    lo, hi = float(np.float32(min_r)) ** 2, float(np.float32(max_r)) ** 2
    out = torch.zeros(centers.shape[0], centers.shape[1], s, dtype=torch.int64)
    for b in range(xyz.shape[0]):
        d = sq_dist(centers[b].double(), xyz[b].double())
        for m in range(centers.shape[1]):
            hits = [k for k in range(xyz.shape[1]) if d[m, k] == 0 or lo <= d[m, k] < hi][:s]
            if hits:
                out[b, m] = torch.tensor(hits + [hits[0]] * (s - len(hits)))
    return out


def ref_knn(k, xyz, centers):
    out = torch.zeros(xyz.shape[0], k, centers.shape[1], dtype=torch.int64)
    for b in range(xyz.shape[0]):
        d = sq_dist(centers[b].double(), xyz[b].double()).nan_to_num(nan=float("inf"))
        out[b] = torch.sort(d, dim=1, stable=True).indices[:, :k].T
    return out


def ref_three_nn(target, source):
    dist = torch.zeros(*target.shape[:2], 3, dtype=torch.float64)
    idx = torch.zeros(*target.shape[:2], 3, dtype=torch.int64)
    for b in range(target.shape[0]):
        d = sq_dist(target[b].double(), source[b].double()).nan_to_num(nan=float("inf"))
        s = torch.sort(d, dim=1, stable=True)
        dist[b], idx[b] = s.values[:, :3].sqrt(), s.indices[:, :3]
    return dist, idx


def ref_gather(features, indices):
    out = torch.zeros(*features.shape[:2], *indices.shape[1:], dtype=torch.float64)
    for b in range(features.shape[0]):
        out[b] = features[b].double()[:, indices[b].long()]
    return out


def ref_three_interpolate(features, indices, weight):
    out = torch.zeros(*features.shape[:2], indices.shape[1], dtype=torch.float64)
    for b in range(features.shape[0]):
        for j in range(3):
            out[b] += features[b].double()[:, indices[b, :, j].long()] * weight[b, :, j].double()
    return out


# ---- each op end to end (check_op), one case each; more sizes behind --run-slow ----------------


def fps_samples(rng):
    xyz = grid_points(rng, 2, 40)
    xyz[1, 7] = xyz[1, 3]  # duplicates: exact ties
    return [(xyz, 12), (grid_points(rng, 1, 5), 5)]


def test_furthest_point_sample(rng):
    check_op("opbridge::furthest_point_sample", ref_fps, fps_samples(rng))


def test_ball_query(rng):
    xyz, centers = grid_points(rng, 2, 48), grid_points(rng, 2, 10)
    centers[0, 0] = xyz[0, 5]  # a center on a point: distance 0 counts even inside min_radius
    check_op("opbridge::ball_query", ref_ball_query,
             [(0.0, 1.0, 5, xyz, centers), (0.5, 1.25, 3, xyz, centers), (0.25, 0.5, 8, xyz, centers)])


def test_knn(rng):
    xyz = grid_points(rng, 2, 30)
    check_op("opbridge::knn", ref_knn, [(4, xyz, grid_points(rng, 2, 9)), (30, xyz, xyz)])


def test_three_nn(rng):
    check_op("opbridge::three_nn", ref_three_nn, [(grid_points(rng, 2, 20), grid_points(rng, 2, 12))])


def test_gather_points(rng):
    f = torch.from_numpy(rng.standard_normal((2, 4, 15)))
    idx = torch.from_numpy(rng.integers(0, 15, (2, 7)))
    check_op("opbridge::gather_points", ref_gather, [(f, idx), (f, idx.int())])


def test_grouping_operation(rng):
    f = torch.from_numpy(rng.standard_normal((2, 3, 12)))
    idx = torch.from_numpy(rng.integers(0, 12, (2, 5, 4)))
    check_op("opbridge::grouping_operation", ref_gather, [(f, idx), (f, idx.int())])


def test_three_interpolate(rng):
    f = torch.from_numpy(rng.standard_normal((2, 3, 10)))
    idx = torch.from_numpy(rng.integers(0, 10, (2, 6, 3)))
    w = torch.from_numpy(rng.uniform(0.1, 1, (2, 6, 3)))
    check_op("opbridge::three_interpolate", ref_three_interpolate, [(f, idx, w), (f, idx.int(), w)])


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 3, 257, 20000])
def test_sizes_slow(rng, n):
    """Sizes around the kernels' block and split thresholds, float32 and float64."""
    b = 2 if n < 20000 else 1
    xyz = grid_points(rng, b, n)
    m = min(n, 64)
    for dt in (torch.float32, torch.float64):
        x = xyz.to(dt)
        assert torch.equal(ops.furthest_point_sample(x, m), ref_fps(xyz, m))
        if n <= 257:
            c = grid_points(rng, b, 7).to(dt)
            assert torch.equal(ops.knn(min(n, 5), x, c), ref_knn(min(n, 5), xyz, c))
            assert torch.equal(ops.ball_query(0.0, 0.75, 6, x, c), ref_ball_query(0.0, 0.75, 6, xyz, c))
            if n >= 3:
                d, i = ops.three_nn(c, x)
                rd, ri = ref_three_nn(c, xyz)
                assert torch.equal(i, ri)
                torch.testing.assert_close(d.double(), rd)


# ---- mmcv's Python signatures --------------------------------------------------------------


def test_knn_mmcv_forms(rng):
    xyz = grid_points(rng, 2, 16).float()
    centers = grid_points(rng, 2, 5).float()
    expected = ref_knn(3, xyz, centers)
    assert torch.equal(ops.knn(3, xyz, centers), expected)
    assert torch.equal(ops.knn(3, xyz.transpose(1, 2).contiguous(), centers.transpose(1, 2).contiguous(),
                               transposed=True), expected)
    assert torch.equal(ops.knn(3, xyz), ref_knn(3, xyz, xyz))


def test_gradients_match_reference(rng):
    """The backward kernels against autograd through the float64 reference."""
    f = torch.from_numpy(rng.standard_normal((2, 3, 9))).requires_grad_()
    idx = torch.from_numpy(rng.integers(0, 9, (2, 6, 3)))
    w = torch.from_numpy(rng.uniform(0.1, 1, (2, 6, 3))).requires_grad_()
    g = torch.from_numpy(rng.standard_normal((2, 3, 6)))
    got = torch.autograd.grad(ops.three_interpolate(f, idx, w), (f, w), g)
    want = torch.autograd.grad(ref_three_interpolate(f, idx, w), (f, w), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    go = torch.from_numpy(rng.standard_normal((2, 3, 6, 3)))
    torch.testing.assert_close(torch.autograd.grad(ops.grouping_operation(f, idx), f, go)[0],
                               torch.autograd.grad(ref_gather(f, idx), f, go)[0])


# ---- NaN coordinates: documented, in range, the same in torch and ONNX Runtime ---------------------


def test_nan_coordinates(rng):
    xyz = grid_points(rng, 1, 20)
    xyz[0, 4, 1] = float("nan")
    xyz[0, 9, 0] = float("nan")
    centers = grid_points(rng, 1, 6)
    # A NaN distance counts as +inf: FPS takes the first NaN point right after index 0.
    fps = ops.furthest_point_sample(xyz, 6)
    assert fps[0, 1] == 4 and torch.equal(fps, ref_fps(xyz, 6))
    knn = ops.knn(20, xyz, centers)
    assert torch.equal(knn, ref_knn(20, xyz, centers))
    assert (knn[0, -2:] == torch.tensor([[4] * 6, [9] * 6])).all()  # last, lowest index first
    bq = ops.ball_query(0.0, 1.0, 4, xyz, centers)
    assert torch.equal(bq, ref_ball_query(0.0, 1.0, 4, xyz, centers))
    assert not ((bq == 4) | (bq == 9)).any()
    src = xyz[:, :5].clone()
    src[0, :3] = float("nan")  # only 2 finite points: the third neighbour is a NaN one, at +inf
    d, i = ops.three_nn(centers, src)
    _, ri = ref_three_nn(centers, src)
    assert torch.equal(i, ri) and torch.isinf(d[..., 2]).all() and i.max() < 5


# ---- bad input: one verdict and message in torch, the fake kernel, ONNX Runtime and _core -----------




def _torch_args(args, device="cpu"):
    return [torch.from_numpy(a).to(device) if isinstance(a, np.ndarray) else a for a in args]


@pytest.mark.parametrize("case", BAD, ids=BAD_IDS)
def test_bad_input_torch(case):
    _, op, _, args, _, message, _ = case
    with pytest.raises(ValueError, match=f"opbridge::{op}: {message}"):
        _call_torch(op, args)


def _call_torch(op, args):
    from opbridge.ops._errors import raise_translated

    try:
        return getattr(torch.ops.opbridge, op).default(*_torch_args(args))
    except RuntimeError as e:
        raise_translated(e)
        raise


@pytest.mark.parametrize("case", [c for c in BAD if c[6]], ids=[c[0] for c in BAD if c[6]])
def test_bad_input_fake_kernel(case):
    _, op, _, args, _, message, _ = case
    with pytest.raises(ValueError, match=f"opbridge::{op}: {message}"):
        _call_torch(op, [torch.from_numpy(a).to("meta") if isinstance(a, np.ndarray) else a for a in args])


@pytest.mark.parametrize("case", BAD, ids=BAD_IDS)
def test_bad_input_core(case):
    from opbridge._op_library import opbridge_library

    _, op, _, args, _, message, _ = case
    with pytest.raises(ValueError, match=f"{op}: {message}"):
        opbridge_library().ops[op].run(*args)


@pytest.mark.parametrize("case", BAD, ids=BAD_IDS)
def test_bad_input_ort(case):
    _, op, onnx_type, args, attr_names, message, _ = case
    model, feeds = single_node_model(op, onnx_type, args, attr_names)
    with pytest.raises(Exception, match=rf"ai\.opbridge::{onnx_type} \(node 'n'\): {message}") as info:
        sess = ort.InferenceSession(model, opbridge.session_options(), providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
    assert type(info.value).__module__.startswith("onnxruntime")


# ---- a PointNet++ written against mmcv's functions, end to end: torch -> ONNX -> ONNX Runtime ------


class SetAbstraction(torch.nn.Module):
    """PointNet++'s single-scale set abstraction, as mmcv-based code writes it."""

    def __init__(self, npoint, radius, nsample, in_channels, out_channels):
        super().__init__()
        self.npoint, self.radius, self.nsample = npoint, radius, nsample
        self.mlp = torch.nn.Sequential(torch.nn.Conv2d(in_channels + 3, out_channels, 1), torch.nn.ReLU(),
                                       torch.nn.Conv2d(out_channels, out_channels, 1))

    def forward(self, xyz, features):
        xyz_t = xyz.transpose(1, 2).contiguous()
        centers = ops.gather_points(xyz_t, ops.furthest_point_sample(xyz, self.npoint))  # (B, 3, npoint)
        new_xyz = centers.transpose(1, 2).contiguous()
        idx = ops.ball_query(0.0, self.radius, self.nsample, xyz, new_xyz)
        grouped = ops.grouping_operation(xyz_t, idx) - centers.unsqueeze(-1)
        if features is not None:
            grouped = torch.cat([grouped, ops.grouping_operation(features, idx)], dim=1)
        return new_xyz, self.mlp(grouped).max(dim=-1).values


class FeaturePropagation(torch.nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.mlp = torch.nn.Conv1d(in_channels, out_channels, 1)

    def forward(self, xyz, known_xyz, skip, known_features):
        dist, idx = ops.three_nn(xyz, known_xyz)
        weight = 1.0 / (dist + 1e-8)
        weight = weight / weight.sum(dim=2, keepdim=True)
        up = ops.three_interpolate(known_features, idx, weight)
        return self.mlp(torch.cat([up, skip], dim=1) if skip is not None else up)


class PointNet2(torch.nn.Module):
    """An SSG classifier and a segmentation head over the same two set abstractions, plus a kNN
    edge feature (random init)."""

    def __init__(self):
        super().__init__()
        self.sa1 = SetAbstraction(32, 0.5, 8, 0, 16)
        self.sa2 = SetAbstraction(8, 1.0, 4, 16, 32)
        self.fp2 = FeaturePropagation(32 + 16, 16)
        self.fp1 = FeaturePropagation(16, 8)
        self.cls = torch.nn.Linear(32, 5)

    def forward(self, xyz):
        xyz1, f1 = self.sa1(xyz, None)
        xyz2, f2 = self.sa2(xyz1, f1)
        up1 = self.fp2(xyz1, xyz2, f1, f2)
        seg = self.fp1(xyz, xyz1, None, up1)
        neighbours = ops.knn(4, xyz1, xyz2)  # (B, 4, 8) indices into the 32 points of level 1
        edge = ops.grouping_operation(f1, neighbours.transpose(1, 2).contiguous()).mean(dim=(2, 3))
        return self.cls(f2.max(dim=-1).values) + edge.sum(dim=1, keepdim=True), seg


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_pointnet2_exports_and_runs_in_onnxruntime(tmp_path, rng, dynamo):
    """Exported with a dynamic batch and point count, then run in ONNX Runtime on other sizes."""
    torch.manual_seed(0)
    model = PointNet2().eval()
    example = torch.from_numpy(rng.uniform(-1, 1, (2, 64, 3)).astype(np.float32))
    path = tmp_path / "pointnet2.onnx"
    if dynamo:
        dims = {"xyz": {0: torch.export.Dim("batch"), 1: torch.export.Dim("points", min=32)}}
        # optimize=False: onnxscript's optimizer (0.7.2) rewrites `dist + 1e-8` to `dist` (it takes
        # a constant within 1e-8 of 0 for 0), and 1 / dist is then inf / inf = NaN where a point
        # coincides with a source point (docs/point_cloud.md).
        opbridge.onnx.export(model, (example,), path, dynamo=True, dynamic_shapes=dims, input_names=["xyz"],
                             optimize=False)
    else:
        opbridge.onnx.export(model, (example,), path, dynamo=False, input_names=["xyz"],
                             output_names=["logits", "seg"], dynamic_axes={"xyz": {0: "batch", 1: "points"}})
    sess = opbridge.InferenceSession(str(path))
    for b, n in [(2, 64), (3, 100)]:
        xyz = rng.uniform(-1, 1, (b, n, 3)).astype(np.float32)
        with torch.no_grad():
            want = [t.numpy() for t in model(torch.from_numpy(xyz))]
        got = sess.run(None, {sess.get_inputs()[0].name: xyz})
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _fps_float32_rounded(x, m):
    """FPS in float32 numpy, every operation rounded on its own (no fused multiply-add)."""
    best, last, out = np.full(x.shape[0], np.inf, np.float32), 0, [0]
    for _ in range(1, m):
        d = x - x[last]
        best = np.minimum(best, (d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1]) + d[:, 2] * d[:, 2])
        last = int(np.argmax(best))
        out.append(last)
    return out


def test_fps_same_indices_on_every_instruction_set(rng, torch_isa):
    """The hot loop is compiled per instruction set without fused multiply-adds. Points on a
    sphere around point 0 are near-ties whose order a fused multiply-add changes (each AVX2 /
    AVX-512 run differed from this reference when the loop was contracted)."""
    for _ in range(3):
        p = rng.standard_normal((4000, 3))
        p = (3.3 * p / np.linalg.norm(p, axis=1, keepdims=True)).astype(np.float32)
        p[0] = 0
        got = ops.furthest_point_sample(torch.from_numpy(p)[None], 8)[0].tolist()
        assert got == _fps_float32_rounded(p, 8)
