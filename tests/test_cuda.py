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
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opbridge

import reference as ref

ROOT = Path(__file__).resolve().parent.parent
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


def _elf_needed(path: str) -> list[str]:
    """DT_NEEDED entries of a 64-bit little-endian ELF shared library."""
    data = Path(path).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "expected a 64-bit little-endian ELF"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    needed = []
    for _name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if sh_type != 6:  # SHT_DYNAMIC
            continue
        strtab = sections[link][4]
        for off in range(offset, offset + size, entsize or 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", strtab + val)
                needed.append(data[strtab + val : end].decode())
    return needed


def test_ort_library_needs_no_cuda_runtime():
    # cudart is linked statically, so the library loads (and runs its CPU ops) on machines
    # without a CUDA runtime or driver.
    needed = _elf_needed(opbridge.get_library_path())
    assert needed, "could not read the library's dependencies"
    assert not [n for n in needed if n.startswith(("libcudart", "libcuda.", "libcublas", "libcusolver"))], needed


def test_cpu_sessions_work_with_cuda_ops_registered():
    # The library registers GroupNorm for both the CPU and the CUDA execution provider (when
    # built with CUDA); a CPU-only session must pick the CPU kernel.
    ort = pytest.importorskip("onnxruntime")
    import onnx_models

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
    result = _run_check(ROOT / "cuda")
    assert result.returncode == 0, result.stdout + result.stderr


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
@pytest.mark.parametrize("op", ["group_norm", "inverse"])
def test_torch_cuda_adapter_compiles(op):
    """Where torch has no CUDA the torch CUDA adapters are not built; still check that they
    compile against this torch's headers and the CUDA toolkit's (syntax and templates)."""
    src = ROOT / "cuda" / "ops" / op / f"{op}_torch.cpp"
    cxx = shutil.which("c++") or shutil.which("g++")
    nvcc = _nvcc()
    found = _torch_cuda_headers()
    if cxx is None or nvcc is None or found is None:
        pytest.skip("needs a C++ compiler, the CUDA toolkit and torch's c10/cuda headers")
    if not (ROOT / "cpp" / "include" / "opbridge" / f"{op}.h").exists():
        pytest.skip(f"the {op} op is not part of this source tree")
    torch, inc = found
    # nvcc may be a wrapper script: ask it where the toolkit's headers are.
    dry = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True)
    m = re.search(r'INCLUDES="-I([^"]+)"', dry.stdout + dry.stderr)
    assert m, f"could not find the CUDA include folder from {nvcc} --dryrun"
    cuda_inc = Path(m.group(1).strip())
    cmd = [cxx, "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           # A CPU wheel lacks the generated c10/cuda/impl/cuda_cmake_macros.h.
           "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE"]
    cmd += [f"-isystem{p}" for p in inc]
    cmd += [f"-I{cuda_inc}", f"-I{ROOT / 'cpp' / 'include'}", f"-I{ROOT / 'cpp' / 'torch'}", str(src)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]


# ---- device tests -------------------------------------------------------------------------

if HAS_TORCH:
    import torch

    TORCH_DTYPES = {
        "float32": torch.float32,
        "float64": torch.float64,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
    }

# Absolute tolerance relative to max(1, |reference|): float32 accumulates in float; the 16-bit
# types round the output once (half: 2^-11, bfloat16: 2^-8 relative) after float statistics.
GN_TOL = {"float32": 2e-5, "float64": 1e-11, "float16": 2e-3, "bfloat16": 1.6e-2}

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
            None if b is None else b.double().numpy()
        )
    got = y.cpu().double().numpy()
    tol = GN_TOL[dtype] * max(1.0, float(np.abs(expect).max()) if expect.size else 1.0)
    np.testing.assert_allclose(got, expect, rtol=0, atol=tol)


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape,groups", [((2, 8, 33), 4), ((1, 4, 40_000), 2)])
def test_group_norm_cuda_unaligned_and_offset(rng, dtype, shape, groups):
    """A misaligned (but contiguous) input takes the scalar path; a large common offset must not
    cost the variance its precision (the statistics never subtract two large sums)."""
    td = TORCH_DTYPES[dtype]
    x = _rounded(rng, shape, td, scale=1.0, offset=300.0 if dtype == "float32" else 30.0)
    n = x.numel()
    buf = torch.empty(n + 1, dtype=td, device="cuda")
    xd = buf[1:].view(shape)
    xd.copy_(x.cuda())
    assert xd.data_ptr() % 16 != 0 and xd.is_contiguous()
    y = torch.ops.opbridge.group_norm(xd, groups, None, None, 1e-5)
    expect = ref.group_norm(x.double().numpy(), groups)
    tol = {"float32": 2e-3, "float16": 4e-2}[dtype]  # inputs near 300 carry 2^-24 * 300 of noise
    np.testing.assert_allclose(y.cpu().double().numpy(), expect, rtol=0, atol=tol)


@pytest.mark.cuda
@pytest.mark.torch
def test_group_norm_cuda_on_side_stream(rng):
    """The op runs on torch's current stream: work queued on a side stream stays ordered."""
    x = _rounded(rng, (4, 32, 16, 16), torch.float32)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        xd = x.to("cuda", non_blocking=False) * 3.0
        y = torch.ops.opbridge.group_norm(xd, 8, None, None, 1e-5) + 1.0
    s.synchronize()
    expect = ref.group_norm(x.double().numpy() * 3.0, 8) + 1.0
    np.testing.assert_allclose(y.cpu().double().numpy(), expect, rtol=0, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.torch
def test_group_norm_cuda_errors():
    x = torch.randn(2, 6, 5, device="cuda")
    with pytest.raises(ValueError, match="num_groups must divide"):
        torch.ops.opbridge.group_norm(x, 4, None, None, 1e-5)
    with pytest.raises(ValueError, match="must be on x's device"):
        torch.ops.opbridge.group_norm(x, 3, torch.ones(6), None, 1e-5)


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
        xs, ws, bs = (t.to(dev).requires_grad_() for t in (x, w, b))
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
    for a, b in zip(got, want):
        assert a.dtype == td and a.shape == b.shape and a.is_contiguous()
        np.testing.assert_allclose(a.double().numpy(), b.double().numpy(), rtol=0,
                                   atol=tol * max(1.0, b.double().abs().max().item()))


def _ort_cuda_session(model_bytes):
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no CUDAExecutionProvider (CPU-only wheel)")
    so = ort.SessionOptions()
    # Fail instead of silently running an opbridge node on the CPU.
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return opbridge.InferenceSession(model_bytes, sess_options=so, providers=["CUDAExecutionProvider"])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape,groups", [((2, 6, 7), 3), ((2, 32, 16, 16), 8), ((1, 2, 70_000), 1)])
def test_group_norm_ort_cuda_matches_reference(rng, dtype, shape, groups):
    import onnx_models

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


def _has_torch_op(name: str) -> bool:
    return HAS_TORCH and hasattr(torch.ops.opbridge, name)


INV_SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32, 33, 48, 64, 65, 100, 200]


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", INV_SIZES)
@pytest.mark.parametrize("batch", [(), (1,), (7,), (2, 3)])
def test_inverse_cuda_matches_reference(rng, dtype, n, batch):
    if not _has_torch_op("inverse"):
        pytest.skip("torch.ops.opbridge.inverse is not part of this build")
    td = TORCH_DTYPES[dtype]
    # Well conditioned: diagonally dominant plus noise, so float32 keeps ~5 digits.
    a = rng.standard_normal((*batch, n, n)) + np.eye(n) * (2.0 * np.sqrt(n))
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
    if not _has_torch_op("inverse"):
        pytest.skip("torch.ops.opbridge.inverse is not part of this build")
    td = TORCH_DTYPES[dtype]
    a = torch.from_numpy(rng.standard_normal((5, n, n))).to(td)
    a[3, n - 1] = a[3, 0]  # matrix 3: two equal rows
    a[4, :, 0] = 0  # matrix 4: a zero column
    with pytest.raises(RuntimeError) as cpu_err:
        torch.ops.opbridge.inverse(a)
    with pytest.raises(RuntimeError) as cuda_err:
        torch.ops.opbridge.inverse(a.cuda())
    assert "matrix 3 of the batch is singular" in str(cuda_err.value)
    assert type(cuda_err.value) is type(cpu_err.value)  # torch.linalg.LinAlgError on both
    assert str(cuda_err.value).splitlines()[0] == str(cpu_err.value).splitlines()[0]


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("n", [3, 20, 50])
def test_inverse_cuda_nan_propagates(rng, n):
    if not _has_torch_op("inverse"):
        pytest.skip("torch.ops.opbridge.inverse is not part of this build")
    a = torch.from_numpy(rng.standard_normal((2, n, n)))
    a[1, 1, 1] = float("nan")
    y = torch.ops.opbridge.inverse(a.cuda()).cpu()
    assert torch.isnan(y[1]).any()
    np.testing.assert_allclose(y[0].numpy(), np.linalg.inv(a[0].numpy()), rtol=0, atol=1e-9)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 4, 32, 70])
def test_inverse_ort_cuda_matches_reference(rng, dtype, n):
    import onnx_models

    if not (ROOT / "cpp" / "ops" / "inverse").is_dir():
        pytest.skip("the Inverse op is not part of this source tree")
    a = (rng.standard_normal((3, n, n)) + np.eye(n) * (2.0 * np.sqrt(n))).astype(dtype)
    model = onnx_models.single_node_model("Inverse", opbridge.DOMAIN, [("X", dtype, list(a.shape))])
    sess = _ort_cuda_session(onnx_models.serialize(model))
    (y,) = sess.run(None, {"X": a})
    expect = np.linalg.inv(a.astype(np.float64))
    tol = {np.float32: 1e-4, np.float64: 1e-11}[dtype] * max(1.0, np.abs(expect).max())
    np.testing.assert_allclose(y.astype(np.float64), expect, rtol=0, atol=tol)
