"""GPU benchmarks of the CUDA kernels (asv). Skipped (NotImplementedError in setup) where torch
has no CUDA device.

Goals they measure (not asserted anywhere):
  GroupNorm: >= 80% of the device's copy bandwidth on large shapes (track_copy_fraction) and
             >= 1.5x torch's native F.group_norm (track_speedup_vs_torch);
  Inverse:   >= 3x torch.linalg.inv for n <= 32 (track_speedup_vs_torch).
Times come from CUDA events around many back-to-back calls, so launch overhead is included
the way a model sees it, and host timer noise is not.
"""

from __future__ import annotations


def _cuda_torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover
        raise NotImplementedError("torch is not installed") from e
    if not torch.cuda.is_available():
        raise NotImplementedError("no CUDA device")
    import opbridge.ops  # noqa: F401  (registers torch.ops.opbridge.*)

    return torch


def _cuda_seconds(torch, fn, iters=50, warmup=5):
    """Mean seconds per call of fn() on the current stream, from CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


GN_SHAPES = {
    "1x64x56x56/G32": ((1, 64, 56, 56), 32),
    "8x256x32x32/G32": ((8, 256, 32, 32), 32),
    "2x512x64x64/G32": ((2, 512, 64, 64), 32),
    "16x512x64x64/G32": ((16, 512, 64, 64), 32),  # 64 MiB in float16: larger than L2
    "4x64x4096/G1": ((4, 64, 4096), 1),  # huge groups: the split path
    "64x32x8/G32": ((64, 32, 8), 32),  # tiny groups
}


class GroupNormCuda:
    params = (["float32", "float16", "bfloat16"], list(GN_SHAPES))
    param_names = ["dtype", "shape"]
    timeout = 300

    def setup(self, dtype, shape):
        torch = self.torch = _cuda_torch()
        dims, self.groups = GN_SHAPES[shape]
        td = getattr(torch, dtype)
        self.x = torch.randn(dims, device="cuda", dtype=td)
        self.w = torch.randn(dims[1], device="cuda", dtype=td)
        self.b = torch.randn(dims[1], device="cuda", dtype=td)
        self.buf = torch.empty_like(self.x)
        self.ours = lambda: torch.ops.opbridge.group_norm(self.x, self.groups, self.w, self.b, 1e-5)
        self.native = lambda: torch.nn.functional.group_norm(self.x, self.groups, self.w, self.b, 1e-5)
        self.copy = lambda: self.buf.copy_(self.x)

    def time_opbridge(self, dtype, shape):
        self.ours()
        self.torch.cuda.synchronize()

    def time_torch_native(self, dtype, shape):
        self.native()
        self.torch.cuda.synchronize()

    def track_gbps(self, dtype, shape):
        """Effective bandwidth: one read of x and one write of y per call."""
        t = _cuda_seconds(self.torch, self.ours)
        return 2 * self.x.numel() * self.x.element_size() / t / 1e9

    track_gbps.unit = "GB/s"

    def track_copy_fraction(self, dtype, shape):
        """Effective bandwidth as a fraction of a device-to-device copy of x (goal >= 0.8)."""
        return _cuda_seconds(self.torch, self.copy) / _cuda_seconds(self.torch, self.ours)

    track_copy_fraction.unit = "fraction of copy bandwidth"

    def track_speedup_vs_torch(self, dtype, shape):
        """torch F.group_norm time / opbridge time (goal >= 1.5)."""
        return _cuda_seconds(self.torch, self.native) / _cuda_seconds(self.torch, self.ours)

    track_speedup_vs_torch.unit = "x"


class InverseCuda:
    params = (["float32", "float64"], [2, 3, 4, 8, 16, 32, 64, 128], [1024, 32768])
    param_names = ["dtype", "n", "batch"]
    timeout = 300

    def setup(self, dtype, n, batch):
        torch = self.torch = _cuda_torch()
        if not hasattr(torch.ops.opbridge, "inverse"):
            raise NotImplementedError("this build has no opbridge::inverse")
        if n >= 64 and batch > 1024:
            raise NotImplementedError("skipped: too slow to be worth benchmarking")
        td = getattr(torch, dtype)
        eye = torch.eye(n, device="cuda", dtype=td)
        self.a = torch.randn(batch, n, n, device="cuda", dtype=td) + 2 * n**0.5 * eye
        self.ours = lambda: torch.ops.opbridge.inverse(self.a)
        self.native = lambda: torch.linalg.inv(self.a)

    def time_opbridge(self, dtype, n, batch):
        self.ours()
        self.torch.cuda.synchronize()

    def time_torch_native(self, dtype, n, batch):
        self.native()
        self.torch.cuda.synchronize()

    def track_speedup_vs_torch(self, dtype, n, batch):
        """torch.linalg.inv time / opbridge time (goal >= 3 for n <= 32)."""
        return _cuda_seconds(self.torch, self.native, iters=20) / _cuda_seconds(self.torch, self.ours, iters=20)

    track_speedup_vs_torch.unit = "x"
