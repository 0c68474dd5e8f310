"""CUDA kernels: build checks (run everywhere) and device tests (marked cuda: skipped with a
reason where there is no GPU).

Device tests compare against float64 references computed on the CPU from the same (rounded)
inputs, and poison the CUDA caching allocator with NaN first, so an element a kernel fails to
write shows up as NaN instead of as a stale correct value.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opbridge

from helpers import cuda_ref, elf
from helpers import reference as ref

ROOT = Path(__file__).resolve().parents[2]
CHECK_STREAMS = ROOT / "cuda" / "check_streams.py"
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    default = "/usr/local/cuda/bin/nvcc"
    return default if os.path.exists(default) else None


# ---- build checks (no GPU needed) ---------------------------------------------------------


def test_cuda_kernels_built_where_nvcc_exists():
    nvcc = _nvcc()
    info = opbridge.build_info()
    if nvcc is None:
        pytest.skip("no nvcc on this machine: the CUDA kernels are not expected to be built")
    if info.get("cuda_option") == "OFF":
        pytest.skip("this build was configured with OPBRIDGE_WITH_CUDA=OFF")
    assert info["cuda"] is True, f"nvcc exists ({nvcc}) but the CUDA kernels were not built: {info}"
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    release = re.search(r"release (\d+\.\d+)", out).group(1)
    assert info["cuda_version"].startswith(release + "."), (info["cuda_version"], release)


def test_ort_library_needs_no_cuda_runtime():
    # cudart is linked statically, so the library loads (and runs its CPU ops) on machines
    # without a CUDA runtime or driver.
    needed = elf.needed(opbridge.get_library_path())
    assert needed, "could not read the library's dependencies"
    assert not [n for n in needed if n.startswith(("libcudart", "libcuda.", "libcublas", "libcusolver"))], needed


def test_cpu_sessions_work_with_cuda_ops_registered():
    # The library registers GroupNorm for both the CPU and the CUDA execution provider (when
    # built with CUDA); a CPU-only session must pick the CPU kernel.
    ort = pytest.importorskip("onnxruntime")
    from helpers import onnx_models

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 5)).astype(np.float32)
    model = onnx_models.single_node_model(
        "GroupNorm", opbridge.DOMAIN, [("X", np.float32, list(x.shape))], {"num_groups": 3}
    )
    sess = opbridge.InferenceSession(onnx_models.serialize(model), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"X": x})
    np.testing.assert_allclose(y, ref.group_norm(x, 3), rtol=1e-5, atol=1e-5)
    assert "CPUExecutionProvider" in ort.get_available_providers()


def _run_check(*paths) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK_STREAMS), *map(str, paths)], capture_output=True, text=True)


def test_no_default_stream_launches_in_cuda_sources():
    result = _run_check(ROOT / "cuda", ROOT / "ops")
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_stream_check_writes_a_depfile_of_what_it_read(tmp_path):
    # The build re-runs the check when a file it read changes: the depfile names each one.
    (tmp_path / "a.cu").write_text("void f(cudaStream_t s) { k<<<1, 1, 0, s>>>(); }\n")
    (tmp_path / "b.cuh").write_text("#pragma once\n")
    (tmp_path / "notes.txt").write_text("cudaMemcpy(\n")
    dep, stamp = tmp_path / "check.d", tmp_path / "check.stamp"
    result = subprocess.run([sys.executable, str(CHECK_STREAMS), "--depfile", str(dep), "--target", str(stamp),
                             str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    target, _, deps = dep.read_text().partition(":")
    assert target == str(stamp) and deps.replace("\\\n", " ").split() == [str(tmp_path / "a.cu"), str(tmp_path / "b.cuh")]


BAD_SNIPPETS = {
    "k<<<grid, block>>>(x);": "has no stream argument",
    "k<<<grid, block, 0>>>(x);": "has no stream argument",
    "k<<<grid, block, 0, 0>>>(x);": "kernel launch on the default stream",
    "k<<<grid, block, smem, nullptr>>>(x);": "kernel launch on the default stream",
    "cudaLaunchKernel((void*)k, grid, block, args, 0, s);": "cudaLaunchKernel called directly",
    "cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);": "cudaMemcpy runs on the default stream",
    "cudaMemsetAsync(p, 0, n);": "cudaMemsetAsync without its stream argument",
    "cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, (cudaStream_t)0);": "cudaMemcpyAsync on the default stream",
    "cudaEventRecord(ev, cudaStreamLegacy);": "cudaEventRecord on the default stream",
    "cudaDeviceSynchronize();": "cudaDeviceSynchronize runs on the default stream",
    "launch_group_norm<float>(nullptr, x, w, b, y, 1, 1, 1, 1, 1e-5, ws, 0);": "launch_group_norm called with",
}


@pytest.mark.parametrize("snippet", list(BAD_SNIPPETS))
def test_default_stream_check_rejects(tmp_path, snippet):
    f = tmp_path / "bad.cu"
    f.write_text(f"// {snippet} (in a comment: ignored)\nvoid f() {{\n  {snippet}\n}}\n")
    result = _run_check(tmp_path)
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{f}:3: ") and BAD_SNIPPETS[snippet] in lines[0], lines


def test_default_stream_check_accepts_explicit_streams(tmp_path):
    f = tmp_path / "good.cu"
    f.write_text(
        "void f(cudaStream_t s) {\n"
        "  k<<<grid, block, 0, s>>>(x);\n"
        "  cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s);\n"
        "  cudaStreamSynchronize(s);\n"
        "  launch_group_norm<Pack<a, b>>(s, x);\n"
        '  const char* msg = "cudaMemset(";\n'
        "}\n"
    )
    result = _run_check(tmp_path)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(
    "stream_arg,ok",
    [("Stream(s)", True), ("0", False), ("nullptr", False), ("Stream(0)", False), ("Stream(NULL)", False)],
)
def test_launch_helper_refuses_null_stream_literals(tmp_path, stream_arg, ok):
    """opbridge::cuda::launch takes a Stream, which cannot be built from a null literal."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("no nvcc on this machine")
    src = tmp_path / "launch_check.cu"
    src.write_text(
        '#include "common/launch.cuh"\n'
        "__global__ void k(int* p) { *p = 1; }\n"
        "cudaError_t f(cudaStream_t s, int* p) {\n"
        "  using namespace opbridge::cuda;\n"
        "  const LaunchShape shape{dim3(1), dim3(1)};\n"
        f"  return launch(k, shape, {stream_arg}, p);\n"
        "}\n"
    )
    # -cuda: the front end only (type checking), no device code generation.
    cmd = [nvcc, "-std=c++17", f"-I{ROOT / 'cuda'}", f"-I{ROOT / 'cpp' / 'include'}", "-cuda", str(src),
           "-o", str(tmp_path / "out.ii")]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if ok:
        assert result.returncode == 0, result.stdout + result.stderr
    else:
        assert result.returncode != 0 and "deleted function" in result.stdout + result.stderr


def _torch_cuda_headers():
    if not HAS_TORCH:
        return None
    import torch
    import torch.utils.cpp_extension as ext

    inc = ext.include_paths()
    if not any(Path(p, "c10", "cuda", "CUDAGuard.h").exists() for p in inc):
        return None
    return torch, inc


@pytest.mark.torch
@pytest.mark.parametrize("op", ["group_norm", "inverse", "ms_deform_attn", "ms_deform_attn_backward"])
def test_torch_ops_have_their_cuda_kernels(op):
    """The ops' CUDA compute functions (ops/<op>/<op>_kernel.cu, OPBRIDGE_KERNEL) are served by
    the generic torch kernel: registered for torch's CUDA dispatch key in every build with CUDA,
    whether or not this torch has CUDA (the stable ABI asks torch for the stream at run time)."""
    import torch

    import opbridge.ops  # noqa: F401
    from opbridge import _core

    if not _core.build_info["cuda"]:
        pytest.skip("this build has no CUDA kernels")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opbridge::{op}", "CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opbridge::{op}", "CPU")


# ---- device tests -------------------------------------------------------------------------

if HAS_TORCH:
    import torch

    # The error types below are the Python API's: torch.ops.opbridge.* raise them as a tagged
    # RuntimeError through the stable ABI (opbridge/ops/_errors.py).
    import opbridge.ops  # noqa: F401

    TORCH_DTYPES = {
        "float32": torch.float32,
        "float64": torch.float64,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
    }

# Absolute tolerance relative to max(1, |reference|): float32 accumulates in float; the 16-bit
# types round the output once (half: 2^-11, bfloat16: 2^-8 relative) after float statistics.
GN_TOL = {"float32": 2e-5, "float64": 1e-11, "float16": 2e-3, "bfloat16": 1.6e-2}
# The eps every GroupNorm call uses: float attributes are float32 in every call (torch, ONNX
# Runtime), so the float64 references take float32(1e-5); with 1e-5 itself a float64 group of two
# close values is off by ~1e-10 (seen on an H200, 2026-11-30).
GN_EPS = float(np.float32(1e-5))

# (x shape, num_groups): tiny groups (many per block), one group per block, groups over a
# cluster or split in chunks, trailing dims of every rank, sizes that rule out vector accesses.
GN_CASES = [
    ((2, 4), 4),  # one element per group
    ((3, 6, 1), 3),
    ((2, 6, 7), 2),
    ((4, 32, 5, 5), 8),
    ((2, 12, 3, 4, 5), 3),
    ((1, 64, 56, 56), 32),
    ((8, 256, 32, 32), 32),  # 8192 elements per group: the largest single-block group
    ((2, 6, 333), 3),  # odd group size: scalar path
    ((1, 2, 70_000), 2),
    ((1, 2, 150_001), 1),  # large odd group
    ((2, 64, 64, 64), 2),  # 131072 elements per group: split path
    ((1, 3, 1_500_000), 1),  # channels longer than a chunk
    ((0, 4, 3), 2),
    ((2, 4, 0), 2),
]


def _poison_cuda_allocator(nbytes: int) -> None:
    # Freed blocks are reused by the next allocations of the caching allocator: fill some with
    # NaN so that unwritten outputs are NaN.
    for _ in range(2):
        t = torch.full((max(1, nbytes // 4) + 1024,), float("nan"), device="cuda")
        del t


def _rounded(rng, shape, dtype, scale=1.0, offset=0.0):
    x = torch.from_numpy(rng.standard_normal(shape) * scale + offset).to(dtype)
    return x


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("dtype", list(GN_TOL))
@pytest.mark.parametrize("shape,groups", GN_CASES, ids=[f"{s}-G{g}" for s, g in GN_CASES])
@pytest.mark.parametrize("affine", ["none", "weight", "both"])
def test_group_norm_cuda_matches_reference(rng, dtype, shape, groups, affine):
    td = TORCH_DTYPES[dtype]
    x = _rounded(rng, shape, td, scale=2.0, offset=0.5)
    c = shape[1]
    w = _rounded(rng, (c,), td) if affine in ("weight", "both") else None
    b = _rounded(rng, (c,), td) if affine == "both" else None
    _poison_cuda_allocator(x.numel() * x.element_size())
    y = torch.ops.opbridge.group_norm(
        x.cuda(), groups, None if w is None else w.cuda(), None if b is None else b.cuda(), 1e-5
    )
    torch.cuda.synchronize()
    assert y.device.type == "cuda" and y.dtype == td and y.shape == x.shape
    if x.numel() == 0:
        expect = np.empty(shape)
    else:
        expect = ref.group_norm(
            x.double().numpy(), groups, None if w is None else w.double().numpy(),
            None if b is None else b.double().numpy(), GN_EPS
        )
    got = y.cpu().double().numpy()
    tol = GN_TOL[dtype] * max(1.0, float(np.abs(expect).max()) if expect.size else 1.0)
    np.testing.assert_allclose(got, expect, rtol=0, atol=tol)


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("shape,groups", [((2, 8, 33), 4), ((1, 4, 40_000), 2), ((1, 2, 10_001), 1)])
def test_group_norm_cuda_unaligned_and_offset(rng, dtype, shape, groups):
    """A misaligned (but contiguous) input takes the scalar path (fused, split and, for one group
    of 20002 elements, cluster kernels); a large common offset must not cost the variance its
    precision (the statistics never subtract two large sums)."""
    td = TORCH_DTYPES[dtype]
    offset, tol = {"float32": (300.0, 2e-3), "float16": (30.0, 4e-2), "bfloat16": (3.0, 6e-2),
                   "float64": (300.0, 1e-9)}[dtype]  # inputs near 300 carry 2^-24 * 300 of noise
    x = _rounded(rng, shape, td, scale=1.0, offset=offset)
    n = x.numel()
    buf = torch.empty(n + 1, dtype=td, device="cuda")
    xd = buf[1:].view(shape)
    xd.copy_(x.cuda())
    assert xd.data_ptr() % 16 != 0 and xd.is_contiguous()
    y = torch.ops.opbridge.group_norm(xd, groups, None, None, 1e-5)
    expect = ref.group_norm(x.double().numpy(), groups)
    np.testing.assert_allclose(y.cpu().double().numpy(), expect, rtol=0, atol=tol)


@pytest.mark.cuda
@pytest.mark.torch
def test_group_norm_cuda_on_side_stream(rng):
    """The op runs on torch's current stream: work queued on a side stream stays ordered."""
    x = _rounded(rng, (4, 32, 16, 16), torch.float32)
    xc = x.cuda()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()  # non-blocking: not ordered with the legacy default stream
    with torch.cuda.stream(s):
        # The stream is held back (~0.1 s) before it writes xd: a kernel queued on any other
        # stream would read xd before the write.
        torch.cuda._sleep(100_000_000)
        xd = xc * 3.0
        y = torch.ops.opbridge.group_norm(xd, 8, None, None, 1e-5) + 1.0
    s.synchronize()
    expect = ref.group_norm(x.double().numpy() * 3.0, 8) + 1.0
    np.testing.assert_allclose(y.cpu().double().numpy(), expect, rtol=0, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.torch
def test_group_norm_cuda_errors():
    x = torch.randn(2, 6, 5, device="cuda")
    with pytest.raises(ValueError, match="num_groups must divide"):
        opbridge.ops.group_norm(x, 4, None, None, 1e-5)
    with pytest.raises(ValueError, match="must be on x's device"):
        opbridge.ops.group_norm(x, 3, torch.ones(6), None, 1e-5)


@pytest.mark.cuda
@pytest.mark.torch
def test_group_norm_cuda_gradients(rng):
    """Backward on CUDA (the composite registered from Python) against the CPU C++ backward."""
    x = _rounded(rng, (3, 6, 4, 5), torch.float64)
    w = _rounded(rng, (6,), torch.float64)
    b = _rounded(rng, (6,), torch.float64)
    g = _rounded(rng, (3, 6, 4, 5), torch.float64)
    grads = []
    for dev in ("cpu", "cuda"):
        # detach(): x.to("cpu") is x itself, and a leaf that requires grad would make its CUDA
        # copy a non-leaf (whose .grad stays None).
        xs, ws, bs = (t.detach().to(dev).requires_grad_() for t in (x, w, b))
        y = opbridge.ops.group_norm(xs, 3, ws, bs, 1e-5)
        y.backward(g.to(dev))
        grads.append([t.grad.cpu() for t in (xs, ws, bs)])
    for cpu, cuda in zip(*grads):
        torch.testing.assert_close(cuda, cpu, rtol=1e-9, atol=1e-9)
    xs = x[:2, :, :2, :2].cuda().requires_grad_()
    ws = w.cuda().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, c: opbridge.ops.group_norm(a, 3, c, None, 1e-5), (xs, ws))


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,groups", [((3, 6, 4, 5), 3), ((2, 4), 2), ((2, 8, 300), 1)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_group_norm_backward_composite_matches_cpu_kernel(rng, dtype, shape, groups, with_weight):
    """The torch-op composite that serves group_norm_backward on CUDA, checked here on the CPU
    against the C++ backward kernel (same outputs, same conventions)."""
    import importlib

    gn = importlib.import_module("opbridge.ops.group_norm")
    td = TORCH_DTYPES[dtype]
    x = _rounded(rng, shape, td)
    g = _rounded(rng, shape, td)
    w = _rounded(rng, (shape[1],), td) if with_weight else None
    want = torch.ops.opbridge.group_norm_backward(g, x, groups, w, None, 1e-5)
    got = gn._group_norm_backward_composite(g, x, groups, w, None, 1e-5)
    tol = {"float64": 1e-10, "float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}[dtype]
    bounds = _group_norm_backward_conditioning(g, x, groups, w, 1e-5, unit_roundoff=2.0**-53 if dtype == "float64"
                                               else 2.0**-24)
    for a, b, bound in zip(got, want, bounds):
        assert a.dtype == td and a.shape == b.shape and a.is_contiguous()
        diff = (a.double() - b.double()).abs()
        allowed = tol * max(1.0, b.double().abs().max().item()) + bound
        assert (diff <= allowed).all(), (f"max |difference| {diff.max().item():.3g}, worst excess "
                                         f"{(diff - allowed).max().item():.3g}")


def _group_norm_backward_conditioning(g, x, groups, w, eps, unit_roundoff):
    """What rounding the mean alone may cost the backward of a group whose spread is small against
    its values (float64, from the inputs): x - mean carries an error up to u*max|x|, so x_hat one of
    u*max|x|*rstd, dx = rstd*(dxhat - mean(dxhat) - x_hat*mean(dxhat*x_hat)) one of
    2*u*max|x|*max|dxhat|*max|x_hat|*rstd**2 and dweight = sum(g*x_hat) one of u*sum(|g|*|x|*rstd);
    twice each is allowed. A two-element group whose values differ by 0.025 (rstd 79) turns 6e-8 into 1e-4 in dx in float32,
    in torch's own group_norm backward as in the composite; a well-conditioned group adds ~1e-6."""
    n, c = x.shape[0], x.shape[1]
    xd = x.double().reshape(n, groups, -1)
    var, mean = torch.var_mean(xd, dim=2, correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    xhat = (xd - mean) * rstd
    dxhat = g.double() if w is None else g.double() * w.double().reshape(1, c, *([1] * (x.dim() - 2)))
    dxhat = dxhat.reshape(n, groups, -1)
    per_group = (xd.abs().amax(2, keepdim=True) * dxhat.abs().amax(2, keepdim=True)
                 * xhat.abs().amax(2, keepdim=True).clamp_min(1.0) * rstd**2)
    dx = 4 * unit_roundoff * per_group.expand_as(xd).reshape(x.shape)
    dweight = 2 * unit_roundoff * (g.double().abs().reshape(n, groups, -1) * xd.abs() * rstd).reshape(n, c, -1).sum(dim=(0, 2))
    return dx, dweight, torch.zeros(c, dtype=torch.float64)


@pytest.mark.torch
def test_backward_composite_as_a_python_kernel_gets_the_declared_defaults(rng):
    """On CUDA, group_norm_backward is the composite above registered as a Python kernel; torch's
    dispatcher calls a Python kernel without the trailing arguments that equal their defaults
    (eps=1e-5 here), which the composite must then take from the declaration. The same dispatch on
    the CPU, through an op of a scratch namespace with group_norm_backward's schema (on an H200 the
    CUDA gradients failed with "missing 1 required positional argument: 'eps'")."""
    import importlib

    from opbridge._op_library import opbridge_library
    from opbridge.ops._torch_adapter import restricted

    gn = importlib.import_module("opbridge.ops.group_norm")
    decl = opbridge_library().ops["group_norm_backward"]
    lib = torch.library.Library("opbridge_defaults_test", "DEF")
    try:
        lib.define("gnb" + str(torch.ops.opbridge.group_norm_backward.default._schema).split("group_norm_backward", 1)[1])
        torch.library.impl("opbridge_defaults_test::gnb", "cpu",
                           restricted(gn._group_norm_backward_composite, decl, "its CUDA form"), lib=lib)
        x = _rounded(rng, (2, 6, 5), torch.float64)
        g = _rounded(rng, (2, 6, 5), torch.float64)
        want = torch.ops.opbridge.group_norm_backward(g, x, 3, None, None, 1e-5)
        for got in (torch.ops.opbridge_defaults_test.gnb(g, x, 3),
                    torch.ops.opbridge_defaults_test.gnb(g, x, 3, None, None, 1e-5)):
            for a, b in zip(got, want):
                np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-10)
    finally:
        lib._destroy()


def _ort_cuda_session(model_bytes, cuda_options=None):
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no CUDAExecutionProvider (CPU-only wheel)")
    so = ort.SessionOptions()
    # Fail instead of silently running an opbridge node on the CPU.
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    provider = ("CUDAExecutionProvider", cuda_options) if cuda_options else "CUDAExecutionProvider"
    return opbridge.InferenceSession(model_bytes, sess_options=so, providers=[provider])


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("op", ["GroupNorm", "Inverse", "MultiScaleDeformableAttention"])
def test_ort_cuda_ops_run_on_orts_compute_stream(rng, op):
    """The ORT CUDA kernels run on the compute stream ORT hands them. ORT is given a torch stream
    (non-blocking) as its user_compute_stream; that stream is held back, then writes the input:
    a kernel on that stream sees the write, one queued on any other stream reads the NaN there
    before it."""
    from helpers import onnx_models

    f32 = np.float32
    if op == "GroupNorm":
        feeds = {"X": (rng.standard_normal((2, 32, 16, 16)) * 2 + 0.5).astype(f32)}
        model = onnx_models.single_node_model(op, opbridge.DOMAIN, [("X", f32, [2, 32, 16, 16])], {"num_groups": 8})
        expect = ref.group_norm(feeds["X"], 8)
        out_shape, out_name = feeds["X"].shape, "Y"
    elif op == "Inverse":
        a = (rng.standard_normal((3, 40, 40)) + np.eye(40) * 2 * np.sqrt(40)).astype(f32)
        feeds = {"X": a}
        model = onnx_models.single_node_model(op, opbridge.DOMAIN, [("X", f32, list(a.shape))])
        expect = np.linalg.inv(a.astype(np.float64))
        out_shape, out_name = a.shape, "Y"
    else:
        value, shapes, starts, loc, attn, grad = _msda_case(rng, 2, "float32")
        feeds = {"value": value.numpy(), "spatial_shapes": shapes.numpy(), "level_start_index": starts.numpy(),
                 "sampling_locations": loc.numpy(), "attention_weights": attn.numpy()}
        model = _msda_onnx_model(f32, list(value.shape), shapes.shape[0], list(loc.shape))
        expect = cuda_ref.ms_deform_attn_with_grads(
            *(t.double().numpy() for t in (value, shapes, starts, loc, attn, grad)))[0]
        out_shape, out_name = expect.shape, "output"
    s = torch.cuda.Stream()
    sess = _ort_cuda_session(model.SerializeToString(), {"user_compute_stream": str(s.cuda_stream),
                                                          "device_id": str(torch.cuda.current_device())})
    binding = sess.io_binding()
    # The float inputs on the device; MSDA's level tables from host memory (where the op reads them).
    src = {k: torch.from_numpy(v).cuda() for k, v in feeds.items() if v.dtype == f32}
    dst = {k: torch.full_like(v, float("nan")) for k, v in src.items()}
    y = torch.full(out_shape, float("nan"), dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)
        for k in dst:
            dst[k].copy_(src[k])
    for k, t in dst.items():
        binding.bind_input(k, "cuda", 0, f32, list(t.shape), t.data_ptr())
    for k in feeds.keys() - dst.keys():
        binding.bind_cpu_input(k, feeds[k])
    binding.bind_output(out_name, "cuda", 0, f32, list(out_shape), y.data_ptr())
    sess.run_with_iobinding(binding)
    s.synchronize()
    tol = 1e-4 * max(1.0, float(np.abs(expect).max()))
    np.testing.assert_allclose(y.cpu().double().numpy(), expect, rtol=0, atol=tol)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_inverse_ort_cuda_singular_error_matches_cpu(rng, dtype):
    """A singular matrix: the CUDA provider reports what the CPU provider does."""
    from helpers import onnx_models

    a = (rng.standard_normal((4, 40, 40)) + np.eye(40) * 2 * np.sqrt(40)).astype(dtype)
    a[2, :, 0] = 0
    model = onnx_models.single_node_model("Inverse", opbridge.DOMAIN, [("X", dtype, list(a.shape))])
    model.graph.node[0].name = "inv"
    cuda = _ort_cuda_session(onnx_models.serialize(model))
    cpu = opbridge.InferenceSession(onnx_models.serialize(model))
    with pytest.raises(Exception) as cpu_err:
        cpu.run(None, {"X": a})
    with pytest.raises(Exception) as cuda_err:
        cuda.run(None, {"X": a})
    assert "matrix 2 of the batch is singular (U[0,0] == 0)" in str(cpu_err.value)
    assert "matrix 2 of the batch is singular (U[0,0] == 0)" in str(cuda_err.value)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape,groups", [((2, 6, 7), 3), ((2, 32, 16, 16), 8), ((1, 2, 70_000), 1)])
def test_group_norm_ort_cuda_matches_reference(rng, dtype, shape, groups):
    from helpers import onnx_models

    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    scale = rng.standard_normal(shape[1]).astype(dtype)
    bias = rng.standard_normal(shape[1]).astype(dtype)
    model = onnx_models.single_node_model(
        "GroupNorm",
        opbridge.DOMAIN,
        [("X", dtype, list(shape)), ("scale", dtype, [shape[1]]), ("bias", dtype, [shape[1]])],
        {"num_groups": groups, "epsilon": 1e-5},
    )
    sess = _ort_cuda_session(onnx_models.serialize(model))
    (y,) = sess.run(None, {"X": x, "scale": scale, "bias": bias})
    expect = ref.group_norm(x, groups, scale, bias)
    tol = {np.float32: 2e-5, np.float64: 1e-6, np.float16: 2e-3}[dtype] * max(1.0, np.abs(expect).max())
    # float64: the ORT attribute epsilon is a float32.
    np.testing.assert_allclose(y.astype(np.float64), expect, rtol=0, atol=tol)


# ---- Inverse ------------------------------------------------------------------------------


INV_SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32, 33, 48, 64, 65, 100, 200]


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", INV_SIZES)
@pytest.mark.parametrize("batch", [(), (1,), (7,), (2, 3)])
def test_inverse_cuda_matches_reference(rng, dtype, n, batch):
    td = TORCH_DTYPES[dtype]
    # Well conditioned: diagonally dominant plus noise, so float32 keeps ~5 digits.
    a = ref.well_conditioned(rng, (*batch, n, n))
    a = torch.from_numpy(a).to(td)
    _poison_cuda_allocator(a.numel() * a.element_size())
    y = torch.ops.opbridge.inverse(a.cuda())
    torch.cuda.synchronize()
    expect = np.linalg.inv(a.double().numpy())
    tol = {"float32": 1e-4, "float64": 1e-11}[dtype] * max(1.0, float(np.abs(expect).max()))
    np.testing.assert_allclose(y.cpu().double().numpy(), expect, rtol=0, atol=tol)


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [2, 3, 8, 32, 40, 100])
def test_inverse_cuda_singular_matches_cpu(rng, dtype, n):
    td = TORCH_DTYPES[dtype]
    a = torch.from_numpy(rng.standard_normal((5, n, n))).to(td)
    a[3, n - 1] = a[3, 0]  # matrix 3: two equal rows
    a[4, :, 0] = 0  # matrix 4: a zero column
    with pytest.raises(RuntimeError) as cpu_err:
        opbridge.ops.inverse(a)
    with pytest.raises(RuntimeError) as cuda_err:
        opbridge.ops.inverse(a.cuda())
    assert "matrix 3 of the batch is singular" in str(cuda_err.value)
    assert type(cuda_err.value) is type(cpu_err.value)  # torch.linalg.LinAlgError on both
    assert str(cuda_err.value).splitlines()[0] == str(cpu_err.value).splitlines()[0]


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("n", [3, 20, 50])
def test_inverse_cuda_nan_propagates(rng, n):
    a = torch.from_numpy(rng.standard_normal((2, n, n)))
    a[1, 1, 1] = float("nan")
    y = torch.ops.opbridge.inverse(a.cuda()).cpu()
    assert torch.isnan(y[1]).any()
    np.testing.assert_allclose(y[0].numpy(), np.linalg.inv(a[0].numpy()), rtol=0, atol=1e-9)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 4, 32, 70])
def test_inverse_ort_cuda_matches_reference(rng, dtype, n):
    from helpers import onnx_models

    a = ref.well_conditioned(rng, (3, n, n)).astype(dtype)
    model = onnx_models.single_node_model("Inverse", opbridge.DOMAIN, [("X", dtype, list(a.shape))])
    sess = _ort_cuda_session(onnx_models.serialize(model))
    (y,) = sess.run(None, {"X": a})
    expect = np.linalg.inv(a.astype(np.float64))
    tol = {np.float32: 1e-4, np.float64: 1e-11}[dtype] * max(1.0, np.abs(expect).max())
    np.testing.assert_allclose(y.astype(np.float64), expect, rtol=0, atol=tol)


# ---- GroupNorm: channels_last and fused activation (op version 2) --------------------------


# (NCHW shape, groups): vector and scalar channel widths, groups of one or many 256-channel pieces,
# one row, enough rows for several tiles, 5-D.
GN_CL_CASES = [
    ((2, 64, 16, 16), 32),
    ((1, 600, 5, 7), 1),  # Cg = 600: three pieces per group, the last 88 channels
    ((2, 6, 3, 3), 3),  # Cg = 2: scalar accesses
    ((2, 9, 4, 4), 3),  # odd C: scalar accesses for float64 too
    ((4, 320, 32, 32), 32),  # Cg = 10 (SD UNet): scalar for float32, 16-bit
    ((2, 512, 8, 8), 32),
    ((1, 256, 128, 128), 32),  # many tiles per sample
    ((2, 8, 1, 1), 4),  # S == 1: the same memory as NCHW
    ((2, 32, 4, 6, 5), 8),  # channels_last_3d
]


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("dtype", list(GN_TOL))
@pytest.mark.parametrize("shape,groups", GN_CL_CASES, ids=[f"{s}-G{g}" for s, g in GN_CL_CASES])
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_group_norm_cuda_channels_last(rng, dtype, shape, groups, activation):
    """A channels_last x is normalized in place of its layout and y keeps the memory format."""
    td = TORCH_DTYPES[dtype]
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    x = _rounded(rng, shape, td, scale=2.0, offset=0.5)
    w = _rounded(rng, (shape[1],), td)
    b = _rounded(rng, (shape[1],), td)
    xd = x.cuda().contiguous(memory_format=fmt)
    _poison_cuda_allocator(x.numel() * x.element_size())
    y = torch.ops.opbridge.group_norm(xd, groups, w.cuda(), b.cuda(), 1e-5, activation)
    torch.cuda.synchronize()
    assert y.is_contiguous(memory_format=fmt) and y.dtype == td and y.shape == x.shape
    expect = cuda_ref.group_norm_any(x.double().numpy(), groups, w.double().numpy(), b.double().numpy(), GN_EPS,
                                     activation)
    tol = GN_TOL[dtype] * max(1.0, float(np.abs(expect).max()))
    np.testing.assert_allclose(y.cpu().double().numpy(), expect, rtol=0, atol=tol)


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,groups", [((2, 6, 7), 2), ((8, 256, 32, 32), 32), ((1, 2, 70_000), 2),
                                          ((2, 64, 64, 64), 2)])
def test_group_norm_cuda_silu_every_path(rng, dtype, shape, groups):
    """SiLU fused into the register-resident, cluster and split paths (contiguous x)."""
    td = TORCH_DTYPES[dtype]
    x = _rounded(rng, shape, td, scale=2.0)
    w = _rounded(rng, (shape[1],), td)
    b = _rounded(rng, (shape[1],), td)
    _poison_cuda_allocator(x.numel() * x.element_size())
    y = torch.ops.opbridge.group_norm(x.cuda(), groups, w.cuda(), b.cuda(), 1e-5, "silu")
    expect = cuda_ref.group_norm_any(x.double().numpy(), groups, w.double().numpy(), b.double().numpy(), GN_EPS, "silu")
    tol = GN_TOL[dtype] * max(1.0, float(np.abs(expect).max()))
    np.testing.assert_allclose(y.cpu().double().numpy(), expect, rtol=0, atol=tol)


@pytest.mark.cuda
@pytest.mark.torch
def test_group_norm_cuda_bad_activation():
    x = torch.randn(2, 6, 5, device="cuda")
    with pytest.raises(ValueError, match="activation"):
        opbridge.ops.group_norm(x, 3, None, None, 1e-5, "gelu")


@pytest.mark.cuda
@pytest.mark.torch
def test_group_norm_cuda_other_layouts_give_contiguous(rng):
    x = _rounded(rng, (2, 8, 6, 5), torch.float32).cuda().transpose(2, 3)  # neither layout
    y = torch.ops.opbridge.group_norm(x, 4, None, None, 1e-5)
    assert y.is_contiguous()
    np.testing.assert_allclose(y.cpu().numpy(), ref.group_norm(x.cpu().double().numpy(), 4), rtol=0, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_group_norm_ort_cuda_activation(rng, dtype, activation):
    from helpers import onnx_models

    shape, groups = (2, 32, 8, 8), 8
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    scale = rng.standard_normal(shape[1]).astype(dtype)
    bias = rng.standard_normal(shape[1]).astype(dtype)
    attrs = {"num_groups": groups}
    if activation != "none":
        attrs["activation"] = activation
    model = onnx_models.single_node_model(
        "GroupNorm", opbridge.DOMAIN,
        [("X", dtype, list(shape)), ("scale", dtype, [shape[1]]), ("bias", dtype, [shape[1]])], attrs,
        domain_version=2,
    )
    sess = _ort_cuda_session(onnx_models.serialize(model))
    (y,) = sess.run(None, {"X": x, "scale": scale, "bias": bias})
    expect = cuda_ref.group_norm_any(x, groups, scale, bias, GN_EPS, activation)
    tol = {np.float32: 2e-5, np.float16: 2e-3}[dtype] * max(1.0, np.abs(expect).max())
    np.testing.assert_allclose(y.astype(np.float64), expect, rtol=0, atol=tol)


@pytest.mark.cuda
@pytest.mark.parametrize("attrs,match", [({"num_groups": 2, "activation": "gelu"}, "activation"),
                                         ({"num_groups": 2, "epsilon": 1}, "epsilon")])
def test_group_norm_ort_cuda_bad_attribute_names_node(attrs, match):
    from helpers import onnx_models

    model = onnx_models.single_node_model("GroupNorm", opbridge.DOMAIN, [("X", np.float32, [2, 4, 3])], attrs,
                                          domain_version=2)
    model.graph.node[0].name = "gn_bad"
    with pytest.raises(Exception, match=f"(?s)gn_bad.*{match}"):
        sess = _ort_cuda_session(onnx_models.serialize(model))
        sess.run(None, {"X": np.ones((2, 4, 3), np.float32)})


# ---- Inverse: on_singular (op version 2) -----------------------------------------------------


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [2, 3, 8, 32, 40, 100])
def test_inverse_cuda_on_singular_nan(rng, dtype, n):
    td = TORCH_DTYPES[dtype]
    a = torch.from_numpy(ref.well_conditioned(rng, (6, n, n))).to(td)
    a[3, n - 1] = a[3, 0]  # two equal rows
    a[4, :, 0] = 0  # a zero column
    _poison_cuda_allocator(a.numel() * a.element_size())
    y = torch.ops.opbridge.inverse(a.cuda(), "nan").cpu()
    assert torch.isnan(y[3]).all() and torch.isnan(y[4]).all()
    ok = [0, 1, 2, 5]
    expect = np.linalg.inv(a[ok].double().numpy())
    tol = {"float32": 1e-4, "float64": 1e-11}[dtype] * max(1.0, float(np.abs(expect).max()))
    np.testing.assert_allclose(y[ok].double().numpy(), expect, rtol=0, atol=tol)
    with pytest.raises(RuntimeError, match="matrix 3 of the batch is singular"):
        torch.ops.opbridge.inverse(a.cuda(), "raise")
    with pytest.raises(ValueError, match="on_singular"):
        opbridge.ops.inverse(a.cuda(), "ignore")


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("n", [3, 40])
def test_inverse_cuda_on_singular_nan_graph_capture(rng, n):
    """With on_singular="nan" nothing is read back: the op can be captured in a CUDA graph."""
    a = torch.from_numpy(ref.well_conditioned(rng, (4, n, n))).float().cuda()
    torch.ops.opbridge.inverse(a, "nan")  # warm-up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = torch.ops.opbridge.inverse(a, "nan")
    fresh = torch.from_numpy(ref.well_conditioned(rng, (4, n, n))).float()
    a.copy_(fresh.cuda())
    g.replay()
    torch.cuda.synchronize()
    np.testing.assert_allclose(y.cpu().double().numpy(), np.linalg.inv(fresh.double().numpy()), rtol=0, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 4, 70])
def test_inverse_ort_cuda_on_singular_nan(rng, dtype, n):
    from helpers import onnx_models

    a = ref.well_conditioned(rng, (3, n, n)).astype(dtype)
    a[1, :, 0] = 0
    model = onnx_models.single_node_model("Inverse", opbridge.DOMAIN, [("X", dtype, list(a.shape))],
                                          {"on_singular": "nan"}, domain_version=2)
    sess = _ort_cuda_session(onnx_models.serialize(model))
    (y,) = sess.run(None, {"X": a})
    assert np.isnan(y[1]).all()
    expect = np.linalg.inv(a[[0, 2]].astype(np.float64))
    tol = {np.float32: 1e-4, np.float64: 1e-11}[dtype] * max(1.0, np.abs(expect).max())
    np.testing.assert_allclose(y[[0, 2]].astype(np.float64), expect, rtol=0, atol=tol)


# ---- MultiScaleDeformableAttention ---------------------------------------------------------

# (N, M, D, Lq, P, levels (H, W)): 1 x 1 and non-square levels, D of every vector width, D above
# 32 vectors (lanes loop), 16 levels, a DETR encoder-like and decoder-like shape.
MSDA_CASES = [
    (1, 1, 1, 1, 1, [(1, 1)]),
    (2, 2, 4, 5, 2, [(3, 5), (1, 1)]),
    (1, 3, 8, 7, 4, [(6, 4), (3, 2), (2, 1), (1, 3)]),
    (2, 1, 12, 3, 3, [(5, 7), (2, 9)]),
    (1, 2, 300, 3, 2, [(4, 4), (2, 3)]),
    (1, 1, 2, 4, 1, [(2, 2)] * 16),
    (2, 8, 32, 1360, 4, [(32, 32), (16, 16), (8, 8), (4, 4)]),  # encoder
    (2, 8, 32, 300, 4, [(64, 64), (32, 32), (16, 16), (8, 8)]),  # decoder
]
MSDA_TOL = {"float32": 2e-5, "float64": 1e-11, "float16": 2e-3, "bfloat16": 1.6e-2}


def _msda_case(rng, case, dtype, nonfinite=False):
    n, m, d, lq, p, levels = MSDA_CASES[case]
    td = TORCH_DTYPES[dtype]
    shapes = torch.tensor(levels, dtype=torch.int64).reshape(-1, 2)
    areas = shapes[:, 0] * shapes[:, 1]
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), areas.cumsum(0)[:-1]])
    s, nl = int(areas.sum()), len(levels)
    value = torch.from_numpy(rng.standard_normal((n, s, m, d))).to(td)
    loc = torch.from_numpy(cuda_ref.ms_deform_attn_locations(rng, n, lq, m, levels, p)).to(td)
    if nonfinite:
        flat = loc.view(-1)
        idx = torch.from_numpy(rng.choice(flat.numel(), 4, replace=False))
        flat[idx] = torch.tensor([float("nan"), float("inf"), -float("inf"), float("nan")], dtype=td)
    attn = torch.from_numpy(rng.uniform(0.0, 1.0, (n, lq, m, nl, p))).to(td)
    grad = torch.from_numpy(rng.standard_normal((n, lq, m * d))).to(td)
    return value, shapes, starts, loc, attn, grad


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("dtype", list(MSDA_TOL))
@pytest.mark.parametrize("case", range(len(MSDA_CASES)))
@pytest.mark.parametrize("tables_on", ["cpu", "cuda"])
def test_ms_deform_attn_cuda_matches_reference(rng, dtype, case, tables_on):
    value, shapes, starts, loc, attn, grad = _msda_case(rng, case, dtype, nonfinite=case % 2 == 1)
    want = cuda_ref.ms_deform_attn_with_grads(*(t.double().numpy() for t in (value, shapes, starts, loc, attn, grad)))
    _poison_cuda_allocator(value.numel() * value.element_size())
    dev = [t.cuda() for t in (value, loc, attn, grad)]
    tables = [t.to(tables_on) for t in (shapes, starts)]
    out = torch.ops.opbridge.ms_deform_attn(dev[0], *tables, dev[1], dev[2])
    grads = torch.ops.opbridge.ms_deform_attn_backward(dev[3], dev[0], *tables, dev[1], dev[2])
    torch.cuda.synchronize()
    assert out.shape == grad.shape and out.dtype == value.dtype
    for name, got, w in zip(("output", "grad_value", "grad_sampling_locations", "grad_attention_weights"),
                            (out, *grads), want):
        assert got.shape == w.shape and got.dtype == value.dtype, name
        tol = MSDA_TOL[dtype] * max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(got.cpu().double().numpy(), w, rtol=0, atol=tol, err_msg=name)


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_ms_deform_attn_cuda_unaligned_scalar_path(rng, dtype):
    """A value that is contiguous but not 16-byte aligned takes the scalar (VEC = 1) kernels."""
    value, shapes, starts, loc, attn, grad = _msda_case(rng, 2, dtype)
    buf = torch.empty(value.numel() + 1, dtype=value.dtype, device="cuda")
    vd = buf[1:].view(value.shape)
    vd.copy_(value.cuda())
    assert vd.data_ptr() % 16 != 0
    out = torch.ops.opbridge.ms_deform_attn(vd, shapes, starts, loc.cuda(), attn.cuda())
    want = cuda_ref.ms_deform_attn_with_grads(*(t.double().numpy() for t in (value, shapes, starts, loc, attn, grad)))
    tol = MSDA_TOL[dtype] * max(1.0, float(np.abs(want[0]).max()))
    np.testing.assert_allclose(out.cpu().double().numpy(), want[0], rtol=0, atol=tol)


@pytest.mark.cuda
@pytest.mark.torch
def test_ms_deform_attn_cuda_graph_capture(rng):
    """With the level table on the CPU nothing synchronizes: forward and backward capture."""
    value, shapes, starts, loc, attn, grad = _msda_case(rng, 6, "float32")
    dev = [t.cuda() for t in (value, loc, attn, grad)]
    torch.ops.opbridge.ms_deform_attn(dev[0], shapes, starts, dev[1], dev[2])
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = torch.ops.opbridge.ms_deform_attn(dev[0], shapes, starts, dev[1], dev[2])
        grads = torch.ops.opbridge.ms_deform_attn_backward(dev[3], dev[0], shapes, starts, dev[1], dev[2])
    fresh = _msda_case(rng, 6, "float32")
    for d, f in zip(dev, (fresh[0], fresh[3], fresh[4], fresh[5])):
        d.copy_(f.cuda())
    g.replay()
    torch.cuda.synchronize()
    want = cuda_ref.ms_deform_attn_with_grads(*(t.double().numpy() for t in fresh))
    for got, w in zip((out, *grads), want):
        np.testing.assert_allclose(got.cpu().double().numpy(), w, rtol=0, atol=2e-5 * max(1.0, np.abs(w).max()))


@pytest.mark.cuda
@pytest.mark.torch
def test_ms_deform_attn_cuda_on_side_stream(rng):
    value, shapes, starts, loc, attn, _ = _msda_case(rng, 2, "float32")
    vc = value.cuda()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)  # see test_group_norm_cuda_on_side_stream
        vd = vc * 2.0
        out = torch.ops.opbridge.ms_deform_attn(vd, shapes.cuda(), starts.cuda(), loc.cuda(), attn.cuda()) + 1.0
    s.synchronize()
    want = cuda_ref.ms_deform_attn_with_grads(*(t.double().numpy() for t in (value * 2.0, shapes, starts, loc, attn,
                                                                            torch.zeros(out.shape))))[0]
    np.testing.assert_allclose(out.cpu().double().numpy(), want + 1.0, rtol=0, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.torch
def test_ms_deform_attn_cuda_bad_input(rng):
    value, shapes, starts, loc, attn, _ = _msda_case(rng, 2, "float32")
    v, lo, at = value.cuda(), loc.cuda(), attn.cuda()
    with pytest.raises(ValueError, match="level_start_index"):
        opbridge.ops.ms_deform_attn(v, shapes, starts + 1, lo, at)
    bad = shapes.clone()
    bad[-1, 0] += 1  # the last level: level_start_index stays consistent, S does not
    with pytest.raises(ValueError, match="spatial_shapes"):
        opbridge.ops.ms_deform_attn(v, bad, starts, lo, at)
    with pytest.raises((TypeError, ValueError), match="spatial_shapes"):
        opbridge.ops.ms_deform_attn(v, shapes.int(), starts, lo, at)
    with pytest.raises((TypeError, ValueError), match="sampling_locations"):
        opbridge.ops.ms_deform_attn(v, shapes, starts, lo.double(), at)


def _msda_onnx_model(dtype, value_shape, levels, loc_shape):
    from onnx import TensorProto, helper

    t = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.float16: TensorProto.FLOAT16}[dtype]
    inputs = [
        helper.make_tensor_value_info("value", t, value_shape),
        helper.make_tensor_value_info("spatial_shapes", TensorProto.INT64, [levels, 2]),
        helper.make_tensor_value_info("level_start_index", TensorProto.INT64, [levels]),
        helper.make_tensor_value_info("sampling_locations", t, loc_shape),
        helper.make_tensor_value_info("attention_weights", t, loc_shape[:-1]),
    ]
    out = helper.make_tensor_value_info("output", t, None)
    node = helper.make_node("MultiScaleDeformableAttention", [i.name for i in inputs], ["output"], name="msda",
                            domain=opbridge.DOMAIN)
    graph = helper.make_graph([node], "msda", inputs, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(opbridge.DOMAIN, 2)],
                             ir_version=9)


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("case", [1, 2, 6])
def test_ms_deform_attn_ort_cuda_matches_reference(rng, dtype, case):
    value, shapes, starts, loc, attn, grad = _msda_case(rng, case, {np.float32: "float32", np.float64: "float64",
                                                                    np.float16: "float16"}[dtype])
    model = _msda_onnx_model(dtype, ["N", value.shape[1], value.shape[2], value.shape[3]], shapes.shape[0],
                             ["N", "Lq", *loc.shape[2:]])
    sess = _ort_cuda_session(model.SerializeToString())
    feeds = {"value": value.numpy(), "spatial_shapes": shapes.numpy(), "level_start_index": starts.numpy(),
             "sampling_locations": loc.numpy(), "attention_weights": attn.numpy()}
    (y,) = sess.run(None, feeds)
    want = cuda_ref.ms_deform_attn_with_grads(*(t.double().numpy() for t in (value, shapes, starts, loc, attn, grad)))[0]
    tol = {np.float32: 2e-5, np.float64: 1e-11, np.float16: 2e-3}[dtype] * max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=0, atol=tol)
    bad = dict(feeds, level_start_index=feeds["level_start_index"] + 1)
    with pytest.raises(Exception, match="(?s)msda.*level_start_index"):
        sess.run(None, bad)


@pytest.mark.cuda
@pytest.mark.torch
def test_transformers_layer_cuda_never_synchronizes(rng):
    """A converted transformers DeformableDetr attention layer on CUDA hands the op host-memory
    level tables built from spatial_shapes_list: the call never waits for the device (torch's
    sync debug mode turns any synchronization into an error) and can be captured in a graph."""
    import types

    mod = pytest.importorskip("transformers.models.deformable_detr.modeling_deformable_detr")
    levels = [(32, 32), (16, 16), (8, 8), (4, 4)]
    cfg = types.SimpleNamespace(d_model=256, num_feature_levels=len(levels), disable_custom_kernels=True)
    layer = mod.DeformableDetrMultiscaleDeformableAttention(cfg, num_heads=8, n_points=4).cuda().eval()
    original = mod.DeformableDetrMultiscaleDeformableAttention(cfg, num_heads=8, n_points=4).cuda().eval()
    original.load_state_dict(layer.state_dict())
    holder = torch.nn.ModuleList([layer])
    opbridge.nn.convert(holder)
    shapes = torch.tensor(levels, device="cuda")
    areas = shapes[:, 0] * shapes[:, 1]
    s = int(areas.sum())
    kwargs = dict(hidden_states=torch.randn(2, 300, 256, device="cuda"), attention_mask=None,
                  encoder_hidden_states=torch.randn(2, s, 256, device="cuda"), position_embeddings=None,
                  reference_points=torch.rand(2, 300, len(levels), 2, device="cuda"), spatial_shapes=shapes,
                  spatial_shapes_list=levels, level_start_index=torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]]))
    with torch.no_grad():
        expected = original(**kwargs)[0]
        holder[0](**kwargs)  # warm-up (cuBLAS handles, the table cache)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = holder[0](**kwargs)[0]
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


# ---- point-cloud ops: the CUDA kernels against the CPU kernels (torch and ORT's CUDA provider) ---


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_point_cloud_ops_cuda_match_cpu(dtype):
    """Indices equal the CPU kernels' exactly (same rounding, ties to the lowest index), features
    and gradients within rounding; the same for ONNX Runtime's CUDA provider (float32)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from helpers import onnx_models

    ops = torch.ops.opbridge
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    xyz = (torch.randint(-32, 33, (2, 700, 3), generator=g) / 16.0).to(dt)
    xyz[1, 5, 2] = float("nan")
    centers = xyz[:, :40].clone()
    f = torch.randn(2, 8, 700, generator=g).to(dt)
    idx3 = torch.randint(0, 700, (2, 40, 5), generator=g)
    w = torch.rand(2, 40, 3, generator=g).to(dt)
    calls = [
        (ops.furthest_point_sample, (xyz, 64)), (ops.ball_query, (0.25, 1.0, 6, xyz, centers)),
        (ops.knn, (9, xyz, centers)), (ops.three_nn, (centers, xyz)), (ops.gather_points, (f, idx3[:, :, 0])),
        (ops.grouping_operation, (f, idx3)), (ops.three_interpolate, (f, idx3[:, :, :3], w)),
        (ops.grouping_operation_backward, (torch.randn(2, 8, 40, 5, generator=g).to(dt), f, idx3)),
        (ops.three_interpolate_backward, (torch.randn(2, 8, 40, generator=g).to(dt), f, idx3[:, :, :3], w)),
    ]
    # int32 indices: the gathers' and three_interpolate's kernels are instantiated for both.
    i32 = idx3.int()
    calls += [
        (ops.gather_points, (f, i32[:, :, 0])), (ops.grouping_operation, (f, i32)),
        (ops.three_interpolate, (f, i32[:, :, :3], w)),
        (ops.grouping_operation_backward, (torch.randn(2, 8, 40, 5, generator=g).to(dt), f, i32)),
        (ops.three_interpolate_backward, (torch.randn(2, 8, 40, generator=g).to(dt), f, i32[:, :, :3], w)),
    ]
    tol = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-2, "bfloat16": 5e-2}[dtype]
    for op, args in calls:
        cpu = op(*args)
        gpu = op(*[a.cuda() if isinstance(a, torch.Tensor) else a for a in args])
        both = [x if isinstance(x, (tuple, list)) else (x,) for x in (cpu, gpu)]
        for c, d in zip(*both):
            if c.dtype == torch.int64:
                assert torch.equal(c, d.cpu()), op
            else:
                torch.testing.assert_close(d.cpu().double(), c.double(), rtol=tol, atol=tol)
    if dtype == "float32":
        x = xyz.numpy()
        model = onnx_models.single_node_model("FurthestPointSample", opbridge.DOMAIN,
                                              [("x", np.float32, list(x.shape))], {"num_points": 64},
                                              out_dtype=np.int64, domain_version=3)
        (got,) = _ort_cuda_session(onnx_models.serialize(model)).run(None, {"x": x})
        np.testing.assert_array_equal(got, ops.furthest_point_sample(xyz, 64).numpy())


def _point_cloud_calls(rng, np_float):
    """(op, ONNX type, args in torch's order, attribute names) of every point-cloud op on one draw:
    2 clouds of 3000 points uniform in a cube (CPU kNN and three_nn take their grid search here, the
    CUDA kernels scan: the indices must still be equal), 500 centers, one point NaN."""
    n, m, c = 3000, 500, 6
    xyz = rng.uniform(-1, 1, (2, n, 3)).astype(np_float)
    xyz[1, 7, 0] = np.nan
    centers = np.ascontiguousarray(xyz[:, 100:100 + m])
    f = rng.standard_normal((2, c, n)).astype(np_float)
    fm = rng.standard_normal((2, c, m)).astype(np_float)
    idx2 = rng.integers(0, n, (2, m))
    idx3 = rng.integers(0, n, (2, m, 5))
    idx_t = rng.integers(0, m, (2, n, 3))
    w = rng.uniform(0, 1, (2, n, 3)).astype(np_float)
    return [
        ("furthest_point_sample", "FurthestPointSample", [xyz, 200], ["num_points"]),
        ("ball_query", "BallQuery", [0.05, 0.2, 16, xyz, centers], ["min_radius", "max_radius", "sample_num"]),
        ("knn", "KNN", [12, xyz, centers], ["k"]),
        ("three_nn", "ThreeNN", [centers, xyz], []),
        ("gather_points", "GatherPoints", [f, idx2], []),
        ("grouping_operation", "GroupingOperation", [f, idx3], []),
        ("three_interpolate", "ThreeInterpolate", [fm, idx_t, w], []),
    ]


def _assert_same(got, want, tol, what):
    if want.dtype == np.int64:
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol, err_msg=what)


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_point_cloud_ops_ort_cuda_match_torch(dtype):
    """Every point-cloud op on ONNX Runtime's CUDA provider (CPU fallback disabled) and on torch's
    CUDA kernels, fresh random clouds: indices equal torch's CPU kernels' exactly, features within
    rounding."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from onnx import TensorProto

    from helpers.point_cloud_cases import single_node_model

    np_float = {"float32": np.float32, "float16": np.float16}[dtype]
    tol = {"float32": 1e-5, "float16": 2e-2}[dtype]
    float_type = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]
    calls = _point_cloud_calls(np.random.default_rng(), np_float)
    expected = []
    for op, _, args, _ in calls:
        fn = getattr(torch.ops.opbridge, op)
        cpu = fn(*[torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args])
        cuda = fn(*[torch.from_numpy(a).cuda() if isinstance(a, np.ndarray) else a for a in args])
        cpu = [t.numpy() for t in (cpu if isinstance(cpu, (tuple, list)) else (cpu,))]
        cuda = [t.cpu().numpy() for t in (cuda if isinstance(cuda, (tuple, list)) else (cuda,))]
        for i, want in enumerate(cpu):
            _assert_same(cuda[i], want, tol, f"{op} output {i}: torch CUDA vs CPU")
        expected.append(cpu)
    # ONNX Runtime's CUDA provider (skipped where this onnxruntime has none, after the torch part).
    for (op, onnx_type, args, attr_names), cpu in zip(calls, expected):
        model, feeds = single_node_model(op, onnx_type, args, attr_names, float_type=float_type)
        got = _ort_cuda_session(model).run(None, feeds)
        for i, want in enumerate(cpu):
            _assert_same(got[i], want, tol, f"{op} output {i}: ORT CUDA vs torch CPU")


@pytest.mark.cuda
@pytest.mark.torch
def test_point_cloud_bad_input_cuda_torch_and_ort():
    """The bad calls whose shapes and attributes decide the verdict: torch's CUDA kernels raise and
    ORT's CUDA provider refuses with the CPU's message (index values are not checked on the device:
    that would need a sync, docs/point_cloud.md)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from helpers.point_cloud_cases import BAD, single_node_model

    cases = [c for c in BAD if c[6]]
    assert len(cases) >= 10
    for _, op, _, args, _, message, _ in cases:
        fn = getattr(torch.ops.opbridge, op)
        with pytest.raises(RuntimeError, match=f"ValueError: opbridge::{op}: {message}"):
            fn(*[torch.from_numpy(a).cuda() if isinstance(a, np.ndarray) else a for a in args])
    # ONNX Runtime itself (opbridge.InferenceSession would refuse these models before ORT sees them).
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no CUDAExecutionProvider (CPU-only wheel)")
    so = opbridge.session_options()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for name, op, onnx_type, args, attr_names, message, _ in cases:
        model, feeds = single_node_model(op, onnx_type, args, attr_names)
        with pytest.raises(Exception, match=rf"ai\.opbridge::{onnx_type} \(node 'n'\): {message}") as info:
            ort.InferenceSession(model, so, providers=["CUDAExecutionProvider"]).run(None, feeds)
        assert type(info.value).__module__.startswith("onnxruntime"), name
