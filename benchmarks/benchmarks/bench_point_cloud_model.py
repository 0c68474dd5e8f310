"""A whole PointNet++ SSG classifier on the CPU (float32, random init) at its published size
(ModelNet40: 1024 points; set abstractions of 512 centers x 32 neighbours within 0.2 and 128 x 64
within 0.4, then one over all points; MLPs 64-64-128, 128-128-256, 256-512-1024; batch 8):

- PointNet2Speedup: torch eager, time(the same model with plain-PyTorch point ops, as
  re-implementations without compiled extensions write them: bench_point_cloud's functions) /
  time(with opbridge.ops).
- PointNet2Ort: ONNX Runtime, time(plain-PyTorch model exported by torch.onnx.export, TorchScript:
  its farthest point sampling unrolls into 511 steps) / time(the opbridge model exported with
  opbridge.onnx.export, our nodes in ORT); and time(opbridge torch eager) / time(opbridge in ORT).

``python benchmarks/benchmarks/bench_point_cloud_model.py`` prints the ratios and each variant's
peak memory above the loaded model (ru_maxrss of child processes, three each).
"""

from __future__ import annotations

import itertools
import os
import tempfile
import types

try:
    from ._common import (
        THREADS,
        measure_speedup,
        ort_runner,
        ort_session,
        ort_value,
        torch_or_skip,
    )
    from .bench_point_cloud import ball_query_torch, fps_torch, gather_torch
except ImportError:  # run as a script
    from _common import (
        THREADS,
        measure_speedup,
        ort_runner,
        ort_session,
        ort_value,
        torch_or_skip,
    )
    from bench_point_cloud import ball_query_torch, fps_torch, gather_torch

BATCH, POINTS = 8, 1024


def plain_ops():
    """bench_point_cloud's plain-PyTorch functions under mmcv's names and argument orders."""
    return types.SimpleNamespace(
        furthest_point_sample=fps_torch,
        gather_points=gather_torch,
        ball_query=lambda lo, hi, s, xyz, c: ball_query_torch(hi, s, xyz, c),
        grouping_operation=gather_torch,
    )


def make_model(ops):
    torch = torch_or_skip()
    nn = torch.nn

    def mlp(channels):
        layers = []
        for a, b in itertools.pairwise(channels):
            layers += [nn.Conv2d(a, b, 1), nn.BatchNorm2d(b), nn.ReLU()]
        return nn.Sequential(*layers)

    class SetAbstraction(nn.Module):
        def __init__(self, npoint, radius, nsample, channels):
            super().__init__()
            self.npoint, self.radius, self.nsample = npoint, radius, nsample
            self.mlp = mlp(channels)

        def forward(self, xyz, features):
            xyz_t = xyz.transpose(1, 2).contiguous()
            if self.npoint is None:  # group all
                grouped = xyz_t.unsqueeze(2)
                if features is not None:
                    grouped = torch.cat([grouped, features.unsqueeze(2)], dim=1)
                return None, self.mlp(grouped).amax(dim=-1)
            centers = ops.gather_points(xyz_t, ops.furthest_point_sample(xyz, self.npoint))
            new_xyz = centers.transpose(1, 2).contiguous()
            idx = ops.ball_query(0.0, self.radius, self.nsample, xyz, new_xyz)
            grouped = ops.grouping_operation(xyz_t, idx) - centers.unsqueeze(-1)
            if features is not None:
                grouped = torch.cat([grouped, ops.grouping_operation(features, idx)], dim=1)
            return new_xyz, self.mlp(grouped).amax(dim=-1)

    class PointNet2SSG(nn.Module):
        def __init__(self, classes=40):
            super().__init__()
            self.sa1 = SetAbstraction(512, 0.2, 32, [3, 64, 64, 128])
            self.sa2 = SetAbstraction(128, 0.4, 64, [128 + 3, 128, 128, 256])
            self.sa3 = SetAbstraction(None, None, None, [256 + 3, 256, 512, 1024])
            self.head = nn.Sequential(nn.Linear(1024, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Linear(512, 256),
                                      nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, classes))

        def forward(self, xyz):
            xyz1, f1 = self.sa1(xyz, None)
            xyz2, f2 = self.sa2(xyz1, f1)
            _, f3 = self.sa3(xyz2, f2)
            return self.head(f3.squeeze(-1))

    torch.manual_seed(0)
    return PointNet2SSG().eval()


def make_input():
    torch = torch_or_skip()
    g = torch.Generator().manual_seed(1)
    return torch.rand(BATCH, POINTS, 3, generator=g) * 2 - 1


def _models():
    import opbridge.ops

    return make_model(opbridge.ops), make_model(plain_ops())


def _exported(model, x, ours):
    import onnx

    torch = torch_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pointnet2.onnx")
        if ours:
            import opbridge.onnx

            opbridge.onnx.export(model, (x,), path, dynamo=False, input_names=["xyz"], output_names=["logits"])
        else:
            torch.onnx.export(model, (x,), path, dynamo=False, input_names=["xyz"], output_names=["logits"],
                              opset_version=17)
        return onnx.load(path)


class PointNet2Speedup:
    """time(plain-PyTorch point ops) / time(opbridge.ops) in the whole model, torch eager, no grad."""

    unit = "x"
    timeout = 900

    def setup(self):
        torch = torch_or_skip()
        self.ours, self.plain = _models()
        self.x = make_input()
        with torch.no_grad():
            if not torch.allclose(self.ours(self.x), self.plain(self.x), rtol=1e-3, atol=1e-3):
                raise AssertionError("the two models disagree")

    def track_speedup(self):
        torch = torch_or_skip()
        with torch.no_grad():
            return measure_speedup(lambda: self.ours(self.x), lambda: self.plain(self.x), rounds=5, round_seconds=0.5)


class PointNet2Ort:
    """ONNX Runtime: 'plain': time(the plain-PyTorch model's plain export) / time(opbridge's export);
    'eager': time(opbridge's model in torch eager) / time(opbridge's export in ORT)."""

    params = ["plain", "eager"]
    param_names = ["against"]
    unit = "x"
    timeout = 1800

    def setup(self, against):
        import numpy as np

        torch = torch_or_skip()
        ours, plain = _models()
        x = make_input()
        self.ort_ours = ort_runner(ort_session(_exported(ours, x, True), custom_ops=True),
                                   {"xyz": ort_value(x.numpy(), "float32")})
        if against == "plain":
            self.other = ort_runner(ort_session(_exported(plain, x, False)), {"xyz": ort_value(x.numpy(), "float32")})
        else:
            def eager():
                with torch.no_grad():
                    ours(x)

            self.other = eager
        sess = ort_session(_exported(ours, x, True), custom_ops=True)
        with torch.no_grad():
            want = ours(x).numpy()
        np.testing.assert_allclose(sess.run(None, {"xyz": x.numpy()})[0], want, rtol=1e-3, atol=1e-3)

    def track_speedup(self, against):
        return measure_speedup(self.ort_ours, self.other, rounds=5, round_seconds=0.5)


def _child_peak(variant):
    """(MiB before the runs, peak MiB) of a child process that builds one model and runs it 3 times
    (ru_maxrss: the first figure holds torch, opbridge and the weights)."""
    import subprocess
    import sys
    from pathlib import Path

    code = (f"import sys, resource; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "import torch, opbridge.ops, bench_point_cloud_model as b\n"
            f"m = b.make_model(opbridge.ops if {variant == 'ours'!r} else b.plain_ops()); x = b.make_input()\n"
            "rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
            "before = rss()\n"
            "with torch.no_grad():\n    [m(x) for _ in range(3)]\n"
            "print(before, rss())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, peak = (float(v) for v in out.stdout.split()[-2:])
    return before, peak


if __name__ == "__main__":
    import subprocess

    model = next((line.split(":", 1)[1].strip() for line in subprocess.run(["lscpu"], capture_output=True, text=True,
                  check=False).stdout.splitlines() if line.startswith("Model name")), "?")
    print(f"{model}, {THREADS} threads, float32, PointNet++ SSG, batch {BATCH} x {POINTS} points")
    b = PointNet2Speedup()
    b.setup()
    print(f"torch eager: plain / opbridge {b.track_speedup():.3g}x")
    for against in PointNet2Ort.params:
        o = PointNet2Ort()
        o.setup(against)
        print(f"ORT: {against} / opbridge in ORT {o.track_speedup(against):.3g}x")
    for variant in ("ours", "plain"):  # the peak moves by ~25 % between runs (malloc arenas of the threads)
        above = sorted(peak - before for before, peak in (_child_peak(variant) for _ in range(3)))
        print(f"torch eager, {variant}: peak {above[0]:.0f}-{above[-1]:.0f} MiB above the loaded model (3 runs)")
