"""Point-cloud ops on the CPU (float32): opbridge's torch ops against plain-PyTorch
implementations of the same semantics, as PointNet++ re-implementations without compiled
extensions write them (FPS as a loop of M vectorized steps; ball query, kNN and three-NN from the
full distance matrix; grouping and interpolation with torch.gather), both timed side by side in
one process.

Shapes: one PointNet++ set-abstraction level on B = 4 clouds of N = 4096 points sampled down to
M = 1024 centers (ball query: 32 neighbours within radius 0.2 of a unit cube; grouping: 64
channels) and one feature-propagation level (three_nn / three_interpolate from 1024 to 4096
points, 128 channels). ``python benchmarks/benchmarks/bench_point_cloud.py`` prints the table of
docs/point_cloud.md.
"""

from __future__ import annotations

try:
    from ._common import THREADS, measure_speedup, opbridge_torch_op, torch_or_skip
except ImportError:  # run as a script
    from _common import THREADS, measure_speedup, opbridge_torch_op, torch_or_skip

B, N, M, S, C, K, RADIUS = 4, 4096, 1024, 32, 64, 16, 0.2
OPS = ["furthest_point_sample", "ball_query", "grouping_operation", "gather_points", "knn", "three_nn",
       "three_interpolate"]


def fps_torch(xyz, m):
    b, n, _ = xyz.shape
    torch = torch_or_skip()
    out = torch.zeros(b, m, dtype=torch.int64, device=xyz.device)
    dist = torch.full((b, n), float("inf"), device=xyz.device)
    last = torch.zeros(b, dtype=torch.int64, device=xyz.device)
    rows = torch.arange(b, device=xyz.device)
    for j in range(1, m):
        d = ((xyz - xyz[rows, last][:, None]) ** 2).sum(-1)
        dist = torch.minimum(dist, d)
        last = dist.argmax(-1)
        out[:, j] = last
    return out


def ball_query_torch(radius, s, xyz, centers):
    torch = torch_or_skip()
    n = xyz.shape[1]
    d2 = torch.cdist(centers, xyz) ** 2
    idx = torch.arange(n, device=xyz.device).expand_as(d2).clone()
    idx[d2 >= radius * radius] = n
    idx = idx.sort(-1).values[..., :s]
    first = idx[..., :1].expand_as(idx)
    idx = torch.where(idx == n, first, idx)
    return torch.where(idx == n, 0, idx)


def knn_torch(k, xyz, centers):
    return torch_or_skip().cdist(centers, xyz).topk(k, dim=-1, largest=False).indices.transpose(1, 2).contiguous()


def three_nn_torch(target, source):
    d, i = torch_or_skip().cdist(target, source).topk(3, dim=-1, largest=False)
    return d, i


def gather_torch(features, indices):
    b, c, _ = features.shape
    flat = indices.reshape(b, 1, -1).expand(b, c, -1)
    return features.gather(2, flat).reshape(b, c, *indices.shape[1:])


def three_interpolate_torch(features, indices, weight):
    return (gather_torch(features, indices) * weight[:, None]).sum(-1)


def make_pair(op, device="cpu", b=B, n=N, m=M):
    """(opbridge call, plain-torch call) for one op, on fresh random inputs on `device`, b clouds of
    n points, m centers."""
    torch = torch_or_skip()
    ours = opbridge_torch_op(op).default
    g = torch.Generator().manual_seed(0)
    B, N, M = b, n, m  # the module's shape names, for this call

    def dev(t):
        return t.to(device)

    xyz = dev(torch.rand(B, N, 3, generator=g))
    centers = xyz[:, :M].contiguous()
    feats = dev(torch.randn(B, C, N, generator=g))
    if op == "furthest_point_sample":
        return (lambda: ours(xyz, M)), (lambda: fps_torch(xyz, M))
    if op == "ball_query":
        return (lambda: ours(0.0, RADIUS, S, xyz, centers)), (lambda: ball_query_torch(RADIUS, S, xyz, centers))
    if op == "knn":
        return (lambda: ours(K, xyz, centers)), (lambda: knn_torch(K, xyz, centers))
    if op == "three_nn":
        return (lambda: ours(xyz, centers)), (lambda: three_nn_torch(xyz, centers))
    if op == "grouping_operation":
        idx = dev(torch.randint(0, N, (B, M, S), generator=g))
        return (lambda: ours(feats, idx)), (lambda: gather_torch(feats, idx))
    if op == "gather_points":
        idx = dev(torch.randint(0, N, (B, M), generator=g))
        return (lambda: ours(feats, idx)), (lambda: gather_torch(feats, idx))
    f = dev(torch.randn(B, 2 * C, M, generator=g))
    idx = dev(torch.randint(0, M, (B, N, 3), generator=g))
    w = dev(torch.rand(B, N, 3, generator=g))
    return (lambda: ours(f, idx, w)), (lambda: three_interpolate_torch(f, idx, w))


class PointCloudSpeedup:
    """time(plain PyTorch) / time(opbridge torch op), float32, THREADS threads; > 1: opbridge is
    faster."""

    params = OPS
    param_names = ["op"]
    unit = "x"
    timeout = 900

    def setup(self, op):
        self.ours, self.theirs = make_pair(op)

    def track_speedup(self, op):
        return measure_speedup(self.ours, self.theirs, rounds=5, round_seconds=0.2)


class PointCloud:
    """Time per call of opbridge's torch op."""

    params = OPS
    param_names = ["op"]

    def setup(self, op):
        self.ours, _ = make_pair(op)

    def time_op(self, op):
        self.ours()


def torch_cluster_pair(op):
    """(opbridge call, torch_cluster call) on the same clouds flattened with a batch vector, or
    NotImplementedError where torch_cluster is not installed (it has no wheels on PyPI: its sdist
    builds against the installed torch, about an hour on 2 cores). torch_cluster's FPS starts at each
    cloud's first point like ours (the same indices); its radius search returns up to
    max_num_neighbors pairs without PointNet++'s fill rule; its kNN uses a k-d tree."""
    torch = torch_or_skip()
    try:
        import torch_cluster
    except ImportError as e:
        raise NotImplementedError("torch_cluster is not installed") from e
    ours = opbridge_torch_op(op).default
    g = torch.Generator().manual_seed(0)
    xyz = torch.rand(B, N, 3, generator=g)
    centers = xyz[:, :M].contiguous()
    flat, batch = xyz.reshape(-1, 3), torch.arange(B).repeat_interleave(N)
    cflat, cbatch = centers.reshape(-1, 3), torch.arange(B).repeat_interleave(M)
    if op == "furthest_point_sample":
        return (lambda: ours(xyz, M)), (lambda: torch_cluster.fps(flat, batch, ratio=M / N, random_start=False))
    if op == "knn":
        return (lambda: ours(K, xyz, centers)), (lambda: torch_cluster.knn(flat, cflat, K, batch, cbatch))
    return ((lambda: ours(0.0, RADIUS, S, xyz, centers)),
            (lambda: torch_cluster.radius(flat, cflat, RADIUS, batch, cbatch, max_num_neighbors=S)))


class PointCloudVsTorchCluster(PointCloudSpeedup):
    """time(torch_cluster) / time(opbridge torch op), float32, THREADS threads, the shapes above;
    skipped where torch_cluster is not installed."""

    params = ["furthest_point_sample", "knn", "ball_query"]

    def setup(self, op):
        self.ours, self.theirs = torch_cluster_pair(op)


if __name__ == "__main__":
    import subprocess

    model = next((line.split(":", 1)[1].strip() for line in subprocess.run(["lscpu"], capture_output=True, text=True,
                  check=False).stdout.splitlines() if line.startswith("Model name")), "?")
    print(f"{model}, {THREADS} threads, float32: time(plain PyTorch) / time(opbridge)")
    print("| op | speed-up |\n|---|---|")
    for op in OPS:
        ours, theirs = make_pair(op)
        print(f"| {op} | {measure_speedup(ours, theirs, rounds=5, round_seconds=0.2):.3g}x |")
