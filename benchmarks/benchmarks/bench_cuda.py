"""GPU benchmarks of the CUDA kernels (asv). Skipped (NotImplementedError in setup) where torch
has no CUDA device, or where this build lacks an op or argument a case needs. On a machine with no
NVIDIA device at all each benchmark has one parameter combination, skipped at once without
importing torch: asv starts a process per benchmark and combination, and importing torch in each of
them only to learn that there is no GPU took about an hour for this module on 2 cores.

Goals they measure (not asserted anywhere):
  GroupNorm: >= 80% of a device-to-device copy's bandwidth on shapes of >= 256 MB
             (track_copy_fraction) and >= 1.5x torch's F.group_norm (track_speedup_vs_torch),
             fp32 and fp16, contiguous and channels_last;
  Inverse:   >= 3x torch.linalg.inv for n <= 32 (track_speedup_vs_torch);
  MSDA:      >= 5x the pure-PyTorch CUDA path (Deformable-DETR's ms_deform_attn_core_pytorch)
             at DETR encoder shapes (track_speedup_forward / track_speedup_backward);
  point-cloud ops: figures only (PointCloudCuda: microseconds and the speed-up over plain PyTorch).
Times come from CUDA events around many back-to-back calls, so launch overhead is included the
way a model sees it, and host timer noise is not.

Without asv: `python benchmarks/benchmarks/bench_cuda.py [--json OUT] [--quick]` runs every case
once and prints a table (what scripts/cuda_check.sh runs on a GPU machine).
"""

from __future__ import annotations

import glob
import importlib.util
import math
import os


def _no_gpu_reason() -> str | None:
    """Why no CUDA device can be used here, found without importing torch; None where one may be
    (torch.cuda.is_available() then decides, in setup)."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return "no CUDA device (CUDA_VISIBLE_DEVICES hides them all)"
    if not glob.glob("/dev/nvidia[0-9]*") and not os.path.exists("/dev/dxg"):
        return "no CUDA device (no /dev/nvidia<N>)"
    return None


NO_GPU = _no_gpu_reason()


def _params(*lists: list) -> tuple:
    """A benchmark's parameter lists; where there is no GPU only their first combination, so that
    asv starts one process per benchmark, whose setup skips it."""
    return tuple(lists) if NO_GPU is None else tuple([values[0]] for values in lists)


def _cuda_torch():
    if NO_GPU is not None:
        raise NotImplementedError(NO_GPU)
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


def _schema_has(torch, op, arg):
    op = getattr(torch.ops.opbridge, op, None)
    return op is not None and any(a.name == arg for a in op.default._schema.arguments)


# ---- GroupNorm -----------------------------------------------------------------------------

GN_SHAPES = {
    "1x64x56x56/G32": ((1, 64, 56, 56), 32),
    "8x256x32x32/G32": ((8, 256, 32, 32), 32),
    "2x512x64x64/G32": ((2, 512, 64, 64), 32),
    "16x512x64x64/G32": ((16, 512, 64, 64), 32),  # 64 MiB in float16: larger than L2
    "8x512x128x128/G32": ((8, 512, 128, 128), 32),  # 256 MiB in float32
    "16x512x128x128/G32": ((16, 512, 128, 128), 32),  # 256 MiB in float16, 512 MiB in float32
    "2x320x64x64/G32": ((2, 320, 64, 64), 32),  # Cg = 10 (SD UNet): scalar channels_last path
    "4x64x4096/G1": ((4, 64, 4096), 1),  # huge groups: the split path
    "64x32x8/G32": ((64, 32, 8), 32),  # tiny groups
}


class GroupNormCuda:
    params = _params(["float32", "float16", "bfloat16"], list(GN_SHAPES), ["contiguous", "channels_last"])
    param_names = ["dtype", "shape", "layout"]
    timeout = 300

    def setup(self, dtype, shape, layout):
        torch = self.torch = _cuda_torch()
        dims, self.groups = GN_SHAPES[shape]
        if layout == "channels_last" and len(dims) != 4:
            raise NotImplementedError("channels_last is for 4-D shapes")
        td = getattr(torch, dtype)
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        self.x = torch.randn(dims, device="cuda", dtype=td).contiguous(memory_format=fmt)
        self.w = torch.randn(dims[1], device="cuda", dtype=td)
        self.b = torch.randn(dims[1], device="cuda", dtype=td)
        self.buf = torch.empty_like(self.x)
        self.ours = lambda: torch.ops.opbridge.group_norm(self.x, self.groups, self.w, self.b, 1e-5)
        self.native = lambda: torch.nn.functional.group_norm(self.x, self.groups, self.w, self.b, 1e-5)
        self.copy = lambda: self.buf.copy_(self.x)

    def time_opbridge(self, dtype, shape, layout):
        self.ours()
        self.torch.cuda.synchronize()

    def time_torch_native(self, dtype, shape, layout):
        self.native()
        self.torch.cuda.synchronize()

    def track_gbps(self, dtype, shape, layout):
        """Effective bandwidth: one read of x and one write of y per call."""
        t = _cuda_seconds(self.torch, self.ours)
        return 2 * self.x.numel() * self.x.element_size() / t / 1e9

    track_gbps.unit = "GB/s"

    def track_copy_fraction(self, dtype, shape, layout):
        """Effective bandwidth as a fraction of a device-to-device copy of x (goal >= 0.8)."""
        return _cuda_seconds(self.torch, self.copy) / _cuda_seconds(self.torch, self.ours)

    track_copy_fraction.unit = "fraction of copy bandwidth"

    def track_speedup_vs_torch(self, dtype, shape, layout):
        """torch F.group_norm time / opbridge time (goal >= 1.5)."""
        return _cuda_seconds(self.torch, self.native) / _cuda_seconds(self.torch, self.ours)

    track_speedup_vs_torch.unit = "x"


class GroupNormSiluCuda:
    """GroupNorm + SiLU fused (activation="silu") against F.silu(F.group_norm(x)), the pair
    diffusion UNets and VAEs run, channels_last as torch's convolutions hand it over."""

    params = _params(["float32", "float16"], ["2x512x64x64/G32", "2x320x64x64/G32", "16x512x128x128/G32"],
                     ["contiguous", "channels_last"])
    param_names = ["dtype", "shape", "layout"]
    timeout = 300

    def setup(self, dtype, shape, layout):
        torch = self.torch = _cuda_torch()
        if not _schema_has(torch, "group_norm", "activation"):
            raise NotImplementedError("this build's opbridge::group_norm has no activation argument")
        dims, g = GN_SHAPES[shape]
        td = getattr(torch, dtype)
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        x = torch.randn(dims, device="cuda", dtype=td).contiguous(memory_format=fmt)
        w = torch.randn(dims[1], device="cuda", dtype=td)
        b = torch.randn(dims[1], device="cuda", dtype=td)
        F = torch.nn.functional
        self.ours = lambda: torch.ops.opbridge.group_norm(x, g, w, b, 1e-5, "silu")
        self.native = lambda: F.silu(F.group_norm(x, g, w, b, 1e-5))

    def track_speedup_vs_torch(self, dtype, shape, layout):
        """F.silu(F.group_norm(x)) time / fused opbridge time."""
        return _cuda_seconds(self.torch, self.native) / _cuda_seconds(self.torch, self.ours)

    track_speedup_vs_torch.unit = "x"


# ---- Inverse -------------------------------------------------------------------------------

INV_CASES = {  # name: (batch, n)
    "100000x4x4": (100000, 4),
    "10000x3x3": (10000, 3),
    "32768x2x2": (32768, 2),
    "1024x8x8": (1024, 8),
    "4096x16x16": (4096, 16),
    "1024x32x32": (1024, 32),
    "1024x64x64": (1024, 64),
    "64x128x128": (64, 128),
    "64x256x256": (64, 256),
}


class InverseCuda:
    params = _params(["float32", "float64"], list(INV_CASES), ["raise", "nan"])
    param_names = ["dtype", "case", "on_singular"]
    timeout = 300

    def setup(self, dtype, case, on_singular):
        torch = self.torch = _cuda_torch()
        if not hasattr(torch.ops.opbridge, "inverse"):
            raise NotImplementedError("this build has no opbridge::inverse")
        batch, n = INV_CASES[case]
        td = getattr(torch, dtype)
        eye = torch.eye(n, device="cuda", dtype=td)
        self.a = torch.randn(batch, n, n, device="cuda", dtype=td) + 2 * n**0.5 * eye
        if on_singular == "raise":
            self.ours = lambda: torch.ops.opbridge.inverse(self.a)
        else:
            # No read-back of the singular-matrix report: no synchronization per call.
            if not _schema_has(torch, "inverse", "on_singular"):
                raise NotImplementedError("this build's opbridge::inverse has no on_singular argument")
            self.ours = lambda: torch.ops.opbridge.inverse(self.a, "nan")
        self.native = lambda: torch.linalg.inv(self.a)

    def time_opbridge(self, dtype, case, on_singular):
        self.ours()
        self.torch.cuda.synchronize()

    def time_torch_native(self, dtype, case, on_singular):
        self.native()
        self.torch.cuda.synchronize()

    def track_speedup_vs_torch(self, dtype, case, on_singular):
        """torch.linalg.inv time / opbridge time (goal >= 3 for n <= 32)."""
        return _cuda_seconds(self.torch, self.native, iters=20) / _cuda_seconds(self.torch, self.ours, iters=20)

    track_speedup_vs_torch.unit = "x"


# ---- MultiScaleDeformableAttention ---------------------------------------------------------

# DETR-style: d_model 256 = 8 heads x 32, 4 levels of a 512 x 512 image (strides 8 to 64), 4 points.
MSDA_SHAPES = {
    "encoder": dict(n=2, lq=None, m=8, d=32, levels=[(64, 64), (32, 32), (16, 16), (8, 8)], p=4),  # Lq = S = 5440
    "decoder": dict(n=2, lq=300, m=8, d=32, levels=[(64, 64), (32, 32), (16, 16), (8, 8)], p=4),
}


def ms_deform_attn_pytorch(value, spatial_shapes, sampling_locations, attention_weights):
    """Deformable-DETR's ms_deform_attn_core_pytorch: the path users run without a fused kernel."""
    import torch
    import torch.nn.functional as F

    n, _, m, d = value.shape
    _, lq, _, levels, p, _ = sampling_locations.shape
    value_list = value.split([int(h) * int(w) for h, w in spatial_shapes], dim=1)
    grids = 2 * sampling_locations - 1
    samples = []
    for lvl, (h, w) in enumerate(spatial_shapes):
        v = value_list[lvl].flatten(2).transpose(1, 2).reshape(n * m, d, int(h), int(w))
        g = grids[:, :, :, lvl].transpose(1, 2).flatten(0, 1)
        samples.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros", align_corners=False))
    a = attention_weights.transpose(1, 2).reshape(n * m, 1, lq, levels * p)
    out = (torch.stack(samples, dim=-2).flatten(-2) * a).sum(-1).view(n, m * d, lq)
    return out.transpose(1, 2).contiguous()


def _msda_locations(torch, shape, n, lq, m, levels, p, pattern):
    """'uniform': uniform in [0, 1] (scattered reads). 'model': what a freshly initialized
    Deformable-DETR layer produces: a reference point per query (its own pixel for the encoder)
    plus per-head offsets along one direction, 1 to P pixels long (the model's grid_init)."""
    nl = len(levels)
    if pattern == "uniform":
        return torch.rand(n, lq, m, nl, p, 2, device="cuda")
    if shape == "encoder":
        refs = []
        for h, w in levels:
            ys, xs = torch.meshgrid(torch.arange(h, device="cuda"), torch.arange(w, device="cuda"), indexing="ij")
            refs.append(torch.stack([(xs.reshape(-1) + 0.5) / w, (ys.reshape(-1) + 0.5) / h], -1))
        ref = torch.cat(refs)[None, :, None, None, None, :].expand(n, lq, 1, 1, 1, 2)
    else:
        ref = torch.rand(n, lq, 1, 1, 1, 2, device="cuda")
    theta = torch.arange(m, device="cuda") * (2 * math.pi / m)
    direction = torch.stack([theta.cos(), theta.sin()], -1)  # (m, 2)
    scale = torch.arange(1, p + 1, device="cuda", dtype=torch.float32)  # 1..P pixels
    wh = torch.tensor([[w, h] for h, w in levels], device="cuda", dtype=torch.float32)  # (L, 2)
    offsets = direction[:, None, None, :] * scale[None, None, :, None] / wh[None, :, None, :]  # (m, L, P, 2)
    return ref + offsets[None, None]


class MsDeformAttnCuda:
    params = _params(["float32", "float16"], list(MSDA_SHAPES), ["model", "uniform"])
    param_names = ["dtype", "shape", "locations"]
    timeout = 300

    def setup(self, dtype, shape, locations):
        torch = self.torch = _cuda_torch()
        if not hasattr(torch.ops.opbridge, "ms_deform_attn"):
            raise NotImplementedError("this build has no opbridge::ms_deform_attn")
        c = MSDA_SHAPES[shape]
        levels = c["levels"]
        s = sum(h * w for h, w in levels)
        n, m, d, p, lq = c["n"], c["m"], c["d"], c["p"], c["lq"] or s
        td = getattr(torch, dtype)
        self.shapes = torch.tensor(levels, dtype=torch.int64)  # host: no sync per call
        self.starts = torch.tensor([0] + [h * w for h, w in levels][:-1], dtype=torch.int64).cumsum(0)
        self.value = torch.randn(n, s, m, d, device="cuda", dtype=td)
        self.loc = _msda_locations(torch, shape, n, lq, m, levels, p, locations).to(td).contiguous()
        self.attn = torch.rand(n, lq, m, len(levels), p, device="cuda", dtype=td).softmax(-1)
        self.grad = torch.randn(n, lq, m * d, device="cuda", dtype=td)
        ops = torch.ops.opbridge
        self.ours = lambda: ops.ms_deform_attn(self.value, self.shapes, self.starts, self.loc, self.attn)
        self.ours_backward = lambda: ops.ms_deform_attn_backward(self.grad, self.value, self.shapes, self.starts,
                                                                 self.loc, self.attn)
        self.native = lambda: ms_deform_attn_pytorch(self.value, levels, self.loc, self.attn)
        leaves = [t.detach().requires_grad_() for t in (self.value, self.loc, self.attn)]

        def native_fwd_bwd():
            out = ms_deform_attn_pytorch(leaves[0], levels, leaves[1], leaves[2])
            torch.autograd.grad(out, leaves, self.grad)

        self.native_fwd_bwd = native_fwd_bwd
        self.ours_fwd_bwd = lambda: (self.ours(), self.ours_backward())

    def time_opbridge_forward(self, dtype, shape, locations):
        self.ours()
        self.torch.cuda.synchronize()

    def time_opbridge_backward(self, dtype, shape, locations):
        self.ours_backward()
        self.torch.cuda.synchronize()

    def time_pytorch_forward(self, dtype, shape, locations):
        self.native()
        self.torch.cuda.synchronize()

    def track_speedup_forward(self, dtype, shape, locations):
        """Pure-PyTorch CUDA forward time / opbridge forward time (goal >= 5 at the encoder shape)."""
        return _cuda_seconds(self.torch, self.native, iters=20) / _cuda_seconds(self.torch, self.ours, iters=20)

    track_speedup_forward.unit = "x"

    def track_speedup_backward(self, dtype, shape, locations):
        """Pure-PyTorch forward + autograd backward / opbridge forward + backward."""
        return (_cuda_seconds(self.torch, self.native_fwd_bwd, iters=10) /
                _cuda_seconds(self.torch, self.ours_fwd_bwd, iters=10))

    track_speedup_backward.unit = "x"

    def track_forward_us(self, dtype, shape, locations):
        return _cuda_seconds(self.torch, self.ours) * 1e6

    track_forward_us.unit = "us"


# ---- point-cloud ops ---------------------------------------------------------------------------

PC_SHAPES = {  # name: (clouds, points, centers)
    "4x4096->1024": (4, 4096, 1024),  # bench_point_cloud.py's PointNet++ set-abstraction level
    "16x16384->4096": (16, 16384, 4096),  # an outdoor-scene-sized level
}
PC_OPS = ["furthest_point_sample", "ball_query", "grouping_operation", "gather_points", "knn", "three_nn",
          "three_interpolate"]


class PointCloudCuda:
    """Each point-cloud op (float32) against the plain-PyTorch CUDA implementation of its semantics
    (bench_point_cloud.py's: FPS as a loop of M vectorized steps, searches from the full distance
    matrix, gathers with torch.gather)."""

    params = _params(PC_OPS, list(PC_SHAPES))
    param_names = ["op", "shape"]
    unit = "x"
    timeout = 600

    def setup(self, op, shape):
        torch = _cuda_torch()
        try:
            from .bench_point_cloud import make_pair
        except ImportError:  # run as a script
            from bench_point_cloud import make_pair
        self.torch = torch
        self.ours, self.theirs = make_pair(op, "cuda", *PC_SHAPES[shape])
        # The plain FPS runs M steps of a few kernels each: fewer repeats keep it to seconds.
        self.iters = 5 if op == "furthest_point_sample" or shape != "4x4096->1024" else 20

    def time_opbridge(self, op, shape):
        self.ours()
        self.torch.cuda.synchronize()

    def track_us(self, op, shape):
        return _cuda_seconds(self.torch, self.ours, iters=self.iters, warmup=2) * 1e6

    track_us.unit = "us"

    def track_speedup_vs_pytorch(self, op, shape):
        theirs = _cuda_seconds(self.torch, self.theirs, iters=self.iters, warmup=2)
        return theirs / _cuda_seconds(self.torch, self.ours, iters=self.iters, warmup=2)


# ---- plain runner (no asv) -----------------------------------------------------------------


def _run_all(quick: bool):
    import itertools
    import time

    results = []
    for cls in (GroupNormCuda, GroupNormSiluCuda, InverseCuda, MsDeformAttnCuda, PointCloudCuda):
        names = [k for k in dir(cls) if k.startswith("track_")]
        for combo in itertools.product(*cls.params):
            if quick and combo != tuple(p[0] for p in cls.params) and cls not in (MsDeformAttnCuda, PointCloudCuda):
                continue
            bench = cls()
            row = {"benchmark": cls.__name__, **dict(zip(cls.param_names, combo))}
            try:
                bench.setup(*combo)
            except NotImplementedError as e:
                row["skipped"] = str(e)
                results.append(row)
                continue
            t0 = time.perf_counter()
            for name in names:
                row[name] = round(float(getattr(bench, name)(*combo)), 4)
            row["seconds"] = round(time.perf_counter() - t0, 2)
            results.append(row)
            print(row, flush=True)
            del bench
    return results


def main(argv=None):
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="first parameter set of each benchmark only")
    args = ap.parse_args(argv)
    torch = _cuda_torch()
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    print(info, flush=True)
    results = _run_all(args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
