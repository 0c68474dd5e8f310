"""The CUDA kernels' index and arithmetic logic, checked on the CPU.

The per-thread math of the MultiScaleDeformableAttention kernels and the work decomposition of
the channels_last GroupNorm kernels live in host-device headers (ms_deform_attn_math.cuh,
group_norm_nhwc.cuh). tests/cuda_ops/cuda_host/ compiles them with the host compiler into small programs
that run them over every thread / lane / tile of the kernels' decomposition (grid-stride loops,
lane shares summed as the shuffles do, atomics as additions), and these tests compare the results
with float64 references. This runs everywhere; the device tests in tests/cuda_ops/test_cuda.py run the
real kernels where there is a GPU.
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from helpers import cuda_ref
from helpers import reference as ref

ROOT = Path(__file__).resolve().parents[2]
HOST = ROOT / "tests" / "cuda_ops" / "cuda_host"
SIM = HOST / "sim"


# What _flags adds where the sanitizers are available (_sanitized probes the compiler with the same).
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]


@functools.cache
def _sanitized() -> bool:
    """Whether the programs are built with AddressSanitizer and UndefinedBehaviorSanitizer: wherever
    the host compiler can link them, unless OPBRIDGE_CUDA_HOST_SANITIZE=0 (=1: required, an error
    where the compiler cannot)."""
    setting = os.environ.get("OPBRIDGE_CUDA_HOST_SANITIZE", "")
    if setting == "0":
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text("int main() { return 0; }\n")
        r = subprocess.run([_compiler(), *SANITIZE_FLAGS, str(src), "-o", str(Path(tmp) / "probe")],
                           capture_output=True, text=True)
    if r.returncode != 0 and setting == "1":
        pytest.fail(f"OPBRIDGE_CUDA_HOST_SANITIZE=1, but {_compiler()} cannot link {' '.join(SANITIZE_FLAGS)}:\n"
                    f"{r.stderr[-2000:]}")
    return r.returncode == 0


def _compiler() -> str:
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("needs a C++ compiler")
    return cxx


def _flags(sim: bool) -> list[str]:
    """The host compiler's flags for the programs of tests/cuda_ops/cuda_host/ (sim: those built against
    the emulated runtime in tests/cuda_ops/cuda_host/sim/). Every load and store is checked by
    AddressSanitizer and UndefinedBehaviorSanitizer (a read past a tensor's or a shared array's end
    fails the test) wherever the compiler has them (_sanitized)."""
    flags = ["-std=c++20" if sim else "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror"]
    if sim:
        flags += ["-pthread", "-Wno-unknown-pragmas", f"-I{SIM}"]
    flags += [f"-I{ROOT}", f"-I{ROOT / 'cuda'}", f"-I{ROOT / 'cpp' / 'include'}"]
    if _sanitized():
        # -g1: line tables (what a report shows) at two thirds of -g's compile time (group_norm_kernel.cu 30 s
        # against 44 s).
        flags += ["-g1", *SANITIZE_FLAGS]
    return flags


@pytest.fixture(scope="module")
def host_programs(tmp_path_factory):
    cxx = _compiler()
    out = tmp_path_factory.mktemp("cuda_host")
    progs = {}
    for name in ("msda_host", "gn_nhwc_host"):
        exe = out / name
        result = subprocess.run([cxx, *_flags(sim=False), str(HOST / f"{name}.cpp"), "-o", str(exe)],
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-4000:]
        progs[name] = exe
    return progs


def _run(exe, args, payload: bytes, tmp_path, count: int) -> np.ndarray:
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(payload)
    result = subprocess.run([str(exe), *map(str, args), str(src), str(dst)], capture_output=True, text=True)
    assert result.returncode == 0, f"{exe.name} exited with {result.returncode}: {result.stderr}"
    out = np.fromfile(dst, dtype=np.float64)
    assert out.size == count, (out.size, count)
    return out


# ---- MultiScaleDeformableAttention ---------------------------------------------------------

# (N, M, D, Lq, P, levels as (H, W)): 1 x 1 and non-square levels, D that takes every vector
# width and D > 32 * VEC (lanes loop over several vectors), one level and many.
MSDA_CASES = [
    (1, 1, 1, 1, 1, [(1, 1)]),
    (2, 2, 4, 5, 2, [(3, 5), (1, 1)]),
    (1, 3, 8, 7, 4, [(6, 4), (3, 2), (2, 1), (1, 3)]),
    (2, 1, 12, 3, 3, [(5, 7), (2, 9)]),
    (1, 2, 160, 3, 2, [(4, 4), (2, 3)]),
    (1, 1, 2, 4, 1, [(2, 2)] * 16),
]


def _msda_inputs(rng, n, m, d, lq, p, levels, nonfinite):
    shapes = np.array(levels, dtype=np.int64).reshape(-1, 2)
    starts = np.concatenate([[0], np.cumsum(shapes[:, 0] * shapes[:, 1])[:-1]]).astype(np.int64)
    s = int((shapes[:, 0] * shapes[:, 1]).sum())
    nl = len(levels)
    value = rng.standard_normal((n, s, m, d))
    # Mostly inside [0, 1], some partly or wholly outside the map.
    loc = cuda_ref.ms_deform_attn_locations(rng, n, lq, m, levels, p)
    if nonfinite and loc.size >= 8:
        flat = loc.reshape(-1)
        idx = rng.choice(flat.size, 4, replace=False)
        flat[idx] = [np.nan, np.inf, -np.inf, np.nan]
    attn = rng.uniform(0.0, 1.0, (n, lq, m, nl, p))
    grad = rng.standard_normal((n, lq, m * d))
    return value, shapes, starts, loc, attn, grad


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["double", "float"])
@pytest.mark.parametrize("case", range(len(MSDA_CASES)))
@pytest.mark.parametrize("nonfinite", [False, True])
def test_ms_deform_attn_kernel_math(host_programs, tmp_path, rng, dtype, case, nonfinite):
    n, m, d, lq, p, levels = MSDA_CASES[case]
    value, shapes, starts, loc, attn, grad = _msda_inputs(rng, n, m, d, lq, p, levels, nonfinite)
    if dtype == "float":
        # The float emulation rounds its inputs to float32: give the reference the same inputs.
        value, loc, attn, grad = (a.astype(np.float32).astype(np.float64) for a in (value, loc, attn, grad))
    want = cuda_ref.ms_deform_attn_with_grads(value, shapes, starts, loc, attn, grad)
    # Every vector width the kernels may pick for this D and type (8: the 16-bit types' width).
    widths = [v for v in ((1, 2) if dtype == "double" else (1, 2, 4, 8)) if d % v == 0]
    nl = len(levels)
    header = np.array([n, value.shape[1], m, d, lq, nl, p], dtype=np.int64)
    payload = b"".join(a.tobytes() for a in (header, shapes, starts, value, loc, attn, grad))
    sizes = [w.size for w in want]
    tol = 1e-11 if dtype == "double" else 2e-5
    for vec in widths:
        got = _run(host_programs["msda_host"], [dtype, vec], payload, tmp_path, sum(sizes))
        parts = np.split(got, np.cumsum(sizes)[:-1])
        for name, g, w in zip(("output", "grad_value", "grad_sampling_locations", "grad_attention_weights"), parts,
                              want):
            w = w.reshape(-1)
            scale = max(1.0, float(np.abs(w).max()))
            np.testing.assert_allclose(g, w, rtol=0, atol=tol * scale, err_msg=f"{name}, VEC={vec}")
        if nonfinite:
            bad = ~np.isfinite(loc).all(axis=-1)  # (n, lq, m, L, P)
            gloc = parts[2].reshape(loc.shape)
            assert (gloc[bad] == 0).all() and (parts[3].reshape(attn.shape)[bad] == 0).all()


@pytest.mark.torch
def test_ms_deform_attn_kernel_math_edges(host_programs, tmp_path):
    """Locations on the sample-range boundaries: pixel x = -1 (only a zero-weight tap inside),
    x just inside -1, x = W - 1 exactly (no right neighbour), x at W - 0.5 (last column)."""
    h, w = 3, 4
    xs = np.array([-0.5 / w, (-0.5 + 1e-3) / w, (w - 0.5) / w, 1.0, 0.0, 0.5, (w - 1 + 0.5) / w, -1e-9])
    ys = np.array([0.5, 1.0, 0.0, 0.25, (-0.5 + 1e-3) / h, 1.0 - 1e-9, 0.5, 0.5])
    p = xs.size
    loc = np.stack([xs, ys], axis=-1).reshape(1, 1, 1, 1, p, 2)
    rng = np.random.default_rng(0)
    value = rng.standard_normal((1, h * w, 1, 4))
    attn = rng.uniform(0.5, 1.0, (1, 1, 1, 1, p))
    grad = rng.standard_normal((1, 1, 4))
    shapes = np.array([[h, w]], dtype=np.int64)
    starts = np.array([0], dtype=np.int64)
    want = cuda_ref.ms_deform_attn_with_grads(value, shapes, starts, loc, attn, grad)
    header = np.array([1, h * w, 1, 4, 1, 1, p], dtype=np.int64)
    payload = b"".join(a.tobytes() for a in (header, shapes, starts, value, loc, attn, grad))
    sizes = [x.size for x in want]
    got = _run(host_programs["msda_host"], ["double", 2], payload, tmp_path, sum(sizes))
    for g, x in zip(np.split(got, np.cumsum(sizes)[:-1]), want):
        np.testing.assert_allclose(g, x.reshape(-1), rtol=0, atol=1e-12)


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["double", "float"])
def test_ms_deform_attn_kernel_math_infinite_weights(host_programs, tmp_path, rng, dtype):
    """Infinite and NaN attention weights on samples partly off the map: an off-map tap contributes
    nothing (the reference's and the CPU kernel's rule), so an infinite weight gives an infinite
    output, not the NaN of inf * 0 (found by the CUDA fuzzer on an H200: the forward multiplied
    the weight into the off-map taps' zeros)."""
    n, m, d, lq, p, levels = 2, 1, 8, 6, 3, [(1, 1), (2, 3)]
    shapes = np.array(levels, dtype=np.int64)
    starts = np.array([0, 1], dtype=np.int64)
    value = rng.standard_normal((n, 7, m, d))
    # Locations at the maps' borders: every sample has taps on and off the map.
    loc = rng.choice([-0.1, 0.05, 0.95, 1.1], size=(n, lq, m, len(levels), p, 2))
    loc += rng.uniform(-0.01, 0.01, loc.shape)
    attn = rng.uniform(0.5, 1.0, (n, lq, m, len(levels), p))
    flat = attn.reshape(-1)
    flat[rng.choice(flat.size, 8, replace=False)] = [np.inf, -np.inf, np.nan, np.inf, np.inf, -np.inf, np.inf, np.nan]
    grad = rng.standard_normal((n, lq, m * d))
    if dtype == "float":
        value, loc, attn = (a.astype(np.float32).astype(np.float64) for a in (value, loc, attn))
    want = ref.ms_deform_attn(value, shapes, starts, loc, attn).reshape(-1)
    assert np.isinf(want).any() and np.isnan(want).any()  # the case exercises both
    header = np.array([n, value.shape[1], m, d, lq, len(levels), p], dtype=np.int64)
    payload = b"".join(a.tobytes() for a in (header, shapes, starts, value, loc, attn, grad))
    total = want.size + value.size + loc.size + attn.size
    for vec in (1, 2) if dtype == "double" else (1, 2, 4, 8):
        got = _run(host_programs["msda_host"], [dtype, vec], payload, tmp_path, total)[:want.size]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"NaN pattern, VEC={vec}")
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 if dtype == "float" else 1e-12,
                                   err_msg=f"VEC={vec}")


# ---- GroupNorm, channels_last --------------------------------------------------------------

# (N, S, C, G): tiny groups (Cg = 1, 2), a whole block of groups (Cg = 256), groups over several
# 256-channel pieces with a short last piece, many rows per tile, a single row, several tiles.
GN_CASES = [
    (2, 5, 6, 3),
    (1, 300, 64, 32),
    (2, 40, 600, 1),
    (1, 3000, 8, 2),
    (3, 7, 512, 2),
    (2, 1, 64, 8),
    (1, 1025, 1024, 4),
    (2, 33, 40, 40),
    (1, 9, 2048, 2),
]


@pytest.mark.parametrize("dtype", ["double", "float"])
@pytest.mark.parametrize("case", GN_CASES, ids=[f"N{n}-S{s}-C{c}-G{g}" for n, s, c, g in GN_CASES])
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_group_norm_nhwc_kernel_decomposition(host_programs, tmp_path, rng, dtype, case, activation):
    n, s, c, g = case
    x = rng.standard_normal((n, s, c)) * 2.0 + 3.0
    w = rng.standard_normal(c)
    b = rng.standard_normal(c)
    if dtype == "float":
        x, w, b = (a.astype(np.float32).astype(np.float64) for a in (x, w, b))
    want = cuda_ref.group_norm_any(x, g, w, b, 1e-5, activation, channels_last=True)
    mean = x.reshape(n, s, g, c // g).mean(axis=(1, 3))
    cg = c // g
    widths = [v for v in ((1, 2) if dtype == "double" else (1, 4, 8)) if cg % v == 0]
    header = np.array([n, s, c, g, 1 if activation == "silu" else 0], dtype=np.int64)
    payload = header.tobytes() + np.array([1e-5]).tobytes() + x.tobytes() + w.tobytes() + b.tobytes()
    tol = 1e-11 if dtype == "double" else 3e-5
    for vec in widths:
        for grid in (1, 3, 1000):
            got = _run(host_programs["gn_nhwc_host"], [dtype, vec, grid], payload, tmp_path, x.size + 2 * n * g)
            y, got_mean = got[: x.size].reshape(x.shape), got[x.size : x.size + n * g].reshape(n, g)
            np.testing.assert_allclose(got_mean, mean, rtol=0, atol=tol * 4, err_msg=f"mean, VEC={vec}")
            np.testing.assert_allclose(y, want, rtol=0, atol=tol * max(1.0, float(np.abs(want).max())),
                                       err_msg=f"y, VEC={vec}, grid={grid}")


# ---- The kernel files themselves, on an emulated device ----------------------------------------
#
# tests/cuda_ops/cuda_host/simt_ops.cpp links ops/*/*_kernel.cu, compiled with the host compiler
# against tests/cuda_ops/cuda_host/sim/ (a CPU emulation of the CUDA runtime: every CUDA thread a fiber
# with its own stack, __syncthreads and warp shuffles as real barriers between them, clusters
# with distributed shared memory, shared memory as exact-size heap buffers; see sim/simt.h), and
# calls the launchers as the adapters do. It is built with AddressSanitizer and
# UndefinedBehaviorSanitizer wherever the compiler has them (_sanitized): any access outside a
# buffer (device or shared memory) fails the test, as compute-sanitizer's memcheck would on a GPU.

EMULATED_OPS = ("inverse", "group_norm", "ms_deform_attn", "furthest_point_sample", "ball_query", "knn", "three_nn",
                 "grouping_operation", "three_interpolate")
KERNEL_FILES = [ROOT / "ops" / op / f"{op}_kernel.cu" for op in EMULATED_OPS]
# What the kernel files' compute functions use: the declarations (and the kernels' arguments from
# a checked call) and the framework-free op machinery.
DECL_FILES = [ROOT / "ops" / op / f"{op}_decl.cpp" for op in EMULATED_OPS]
COMMON_FILES = [ROOT / "cpp" / "common" / name for name in ("decl_builder.cpp", "decl_validate.cpp", "shape_rules.cpp", "call_checks.cpp", "describe_json.cpp", "kernel.cpp")]
# The emulated device: few SMs, so that launches use small grids and the grid-stride loops wrap.
SIM_SMS = 1


@pytest.fixture(scope="session")
def simt_ops(tmp_path_factory):
    """The simt_ops program (built once per session, two translation units at a time: a pool of two
    compilers, each taking the next file as soon as it is done, the kernel files first)."""
    cxx = _compiler()
    out = tmp_path_factory.mktemp("simt_ops")
    flags = _flags(sim=True)
    sources = [(src, ["-x", "c++"]) for src in KERNEL_FILES]
    sources += [(src, []) for src in DECL_FILES + COMMON_FILES]
    sources += [(ROOT / "cuda" / "common" / "device.cpp", []), (SIM / "simt.cpp", []), (HOST / "simt_ops.cpp", [])]
    objects = [out / f"{i}_{src.stem}.o" for i, (src, _) in enumerate(sources)]

    def compile_one(i: int) -> subprocess.CompletedProcess:
        src, lang = sources[i]
        return subprocess.run([cxx, *flags, *lang, "-c", str(src), "-o", str(objects[i])], capture_output=True,
                              text=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for (src, _), result in zip(sources, pool.map(compile_one, range(len(sources)))):
            assert result.returncode == 0, f"{src}:\n{result.stderr[-4000:]}"
    exe = out / "simt_ops"
    result = subprocess.run([cxx, *flags, *map(str, objects), "-o", str(exe)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    return exe


@pytest.fixture(scope="session")
def simt_selftest(tmp_path_factory):
    cxx = _compiler()
    exe = tmp_path_factory.mktemp("simt_selftest") / "simt_selftest"
    r = subprocess.run([cxx, *_flags(sim=True), str(HOST / "simt_selftest.cpp"), str(SIM / "simt.cpp"), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return exe


# case -> what the emulation must print (None: the case must succeed)
SELFTEST = {
    "reduce": None,
    "cluster": None,
    "nan-abs": None,
    "divergent": "divergent __syncthreads in block 0",
    "exited-lane": "not every lane of the warp reached",
    "deadlock": "can make no progress",
    "shared-oob": "heap-buffer-overflow",
}


@pytest.mark.parametrize("case", list(SELFTEST))
def test_emulation_self_check(simt_selftest, case):
    """The emulation computes right (a block reduction over a partial warp, a cluster reading its
    blocks' shared memory) and reports the mistakes it is there to find, so that a kernel test
    passing on it means something."""
    if case == "shared-oob" and not _sanitized():
        pytest.skip("an out-of-bounds shared-memory read is reported by AddressSanitizer, which this build has not "
                    "(OPBRIDGE_CUDA_HOST_SANITIZE=0, or the compiler cannot link it)")
    r = subprocess.run([str(simt_selftest), case], capture_output=True, text=True, timeout=120)
    if SELFTEST[case] is None:
        assert r.returncode == 0, r.stderr[-3000:]
    else:
        assert r.returncode != 0 and SELFTEST[case] in r.stderr, r.stderr[-3000:]


# The kernels (by address in simt_ops) that this session's emulated calls launched.
_LAUNCHED: set[int] = set()


def _simt(exe, tmp_path, op, dtype, payload: bytes, sms=SIM_SMS, cc=90):
    """Runs one launcher call; returns the output file's bytes and what the emulation reports."""
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(payload)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", UBSAN_OPTIONS="print_stacktrace=1")
    result = subprocess.run([str(exe), op, dtype, str(sms), str(cc), str(src), str(dst)], capture_output=True,
                            text=True, env=env, timeout=900)
    assert result.returncode == 0, f"simt_ops {op} {dtype} exited with {result.returncode}:\n{result.stderr[-6000:]}"
    assert "launches=" in result.stderr
    _LAUNCHED.update(int(line[7:], 16) for line in result.stderr.splitlines() if line.startswith("kernel="))
    return dst.read_bytes(), result.stderr


def _round_to(dtype: str, a):
    """a rounded to `dtype` (round to nearest even), as float64: inputs the kernels hold exactly."""
    a = np.asarray(a, dtype=np.float64)
    if dtype == "double":
        return a.copy()
    if dtype == "float":
        return a.astype(np.float32).astype(np.float64)
    if dtype == "half":
        return a.astype(np.float16).astype(np.float64)
    assert dtype == "bfloat16"
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


# -- Inverse: every path of the launcher ---------------------------------------------------------

# n: 1 and 2 (the float 2 x 2 adjugate kernel), every register-path width W = next_pow2(n) with
# its edges (3, 4, 5, 8, 9, 16, 17, 31, 32), the shared-memory path's ends (33, 64; 40 is where a
# GPU found the out-of-bounds read), the in-place global path past it (65, 97).
INVERSE_SIZES = [1, 2, 3, 4, 5, 8, 9, 16, 17, 31, 32, 33, 40, 64, 65, 97]


def _inverse_batch(n: int) -> int:
    # Small matrices: enough for the register path's grid-stride loop to wrap on the one-SM
    # device (32 blocks of 128 / W matrices); larger ones: a few blocks (each matrix costs a
    # block's worth of emulated threads for n steps).
    w = 1 << max(0, (n - 1).bit_length())
    if n <= 8:
        return 32 * (128 // w) + 3
    return 5 if n <= 40 else 3


def _inverse_call(exe, tmp_path, dtype, a, nan_on_singular=False, in_place=False, sms=SIM_SMS):
    batch, n, _ = a.shape
    header = np.array([batch, n, int(nan_on_singular), int(in_place)], dtype=np.int64)
    raw, _ = _simt(exe, tmp_path, "inverse", dtype, header.tobytes() + a.tobytes(), sms=sms)
    err, info = np.frombuffer(raw[:16], dtype=np.int64)
    return int(err), int(np.uint64(info)), np.frombuffer(raw[16:], dtype=np.float64).reshape(a.shape)


INFO_OK = (1 << 64) - 1


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("n", INVERSE_SIZES)
def test_inverse_kernels_emulated(simt_ops, tmp_path, rng, dtype, n):
    """Well-conditioned matrices: each path's result against float64 numpy, out of place and in
    place (the adapters' two uses), the report word left at 'no singular matrix'."""
    batch = _inverse_batch(n)
    a = _round_to(dtype, ref.well_conditioned(rng, (batch, n, n)))
    expect = np.linalg.inv(a)
    tol = {"float": 1e-4, "double": 1e-11}[dtype] * max(1.0, float(np.abs(expect).max()))
    for in_place in (False, True):
        err, info, y = _inverse_call(simt_ops, tmp_path, dtype, a, in_place=in_place)
        assert err == 0 and info == INFO_OK, (err, hex(info))
        np.testing.assert_allclose(y, expect, rtol=0, atol=tol, err_msg=f"in_place={in_place}")


def _singular_batch(rng, dtype, n, batch):
    a = ref.well_conditioned(rng, (batch, n, n))
    a[1, n - 1] = a[1, 0]  # two equal rows: the last pivot is exactly zero (step n - 1)
    a[2, :, 0] = 0.0  # a zero column: the first pivot is zero (step 0), then NaN everywhere
    return _round_to(dtype, a)


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("n", [2, 3, 8, 32, 33, 40, 64, 65])
def test_inverse_kernels_emulated_singular(simt_ops, tmp_path, rng, dtype, n):
    """Singular matrices (equal rows, a zero column) among invertible ones: the report names the
    first singular matrix and the step of its zero pivot; with nan_on_singular its output is all
    NaN and the others are exact. The zero column leaves NaNs behind its zero pivot: the pivot
    search must still pick a row of the matrix (the out-of-bounds read a GPU found at n = 40)."""
    if n == 2:
        a = _round_to(dtype, rng.standard_normal((4, 2, 2)) + np.eye(2) * 3)
        a[1, 1] = a[1, 0]
        a[2, :, 0] = 0.0
    else:
        a = _singular_batch(rng, dtype, n, 4)
    ok = [0, 3]
    expect = np.linalg.inv(a[ok])
    tol = {"float": 1e-4, "double": 1e-11}[dtype] * max(1.0, float(np.abs(expect).max()))
    for nan_on_singular in (False, True):
        err, info, y = _inverse_call(simt_ops, tmp_path, dtype, a, nan_on_singular=nan_on_singular)
        assert err == 0
        assert (info >> 24, info & 0xFFFFFF) == (1, n - 1), hex(info)
        np.testing.assert_allclose(y[ok], expect, rtol=0, atol=tol)
        if nan_on_singular:
            assert np.isnan(y[1]).all() and np.isnan(y[2]).all()
    # The zero column alone: reported at step 0.
    err, info, _ = _inverse_call(simt_ops, tmp_path, dtype, a[2:])
    assert err == 0 and (info >> 24, info & 0xFFFFFF) == (0, 0), hex(info)


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("n", [3, 17, 40, 65])
def test_inverse_kernels_emulated_nonfinite(simt_ops, tmp_path, rng, dtype, n):
    """NaN and inf entries: not singular (no pivot is exactly zero), a NaN entry's matrix gets
    NaN in its result, and every other matrix of the batch is exact (the infinite entries'
    matrix may come out finite: the exact inverse is)."""
    a = _round_to(dtype, ref.well_conditioned(rng, (4, n, n)))
    a[1, n // 2, n // 3] = np.nan
    a[2, 0, n - 1] = np.inf
    a[2, n - 1, 0] = -np.inf
    err, info, y = _inverse_call(simt_ops, tmp_path, dtype, a)
    assert err == 0 and info == INFO_OK, hex(info)
    assert np.isnan(y[1]).any()
    ok = [0, 3]
    expect = np.linalg.inv(a[ok])
    tol = {"float": 1e-4, "double": 1e-11}[dtype] * max(1.0, float(np.abs(expect).max()))
    np.testing.assert_allclose(y[ok], expect, rtol=0, atol=tol)


def test_inverse_kernels_emulated_block_path_wraps(simt_ops, tmp_path, rng):
    """The shared-memory path's grid-stride loop: more matrices than blocks (32 on the one-SM
    device), so one block inverts two in turn (its shared memory and singular flag reused), a
    singular one among them."""
    n, batch = 33, 34
    a = _round_to("float", ref.well_conditioned(rng, (batch, n, n)))
    a[32, :, 5] = 0.0  # inverted second by block 0
    err, info, y = _inverse_call(simt_ops, tmp_path, "float", a, nan_on_singular=True)
    assert err == 0 and info >> 24 == 32, hex(info)
    ok = [i for i in range(batch) if i != 32]
    expect = np.linalg.inv(a[ok])
    np.testing.assert_allclose(y[ok], expect, rtol=0, atol=1e-4 * max(1.0, float(np.abs(expect).max())))
    assert np.isnan(y[32]).all()


def test_inverse_emulation_catches_the_gpu_read(simt_ops, tmp_path, rng):
    """The emulation finds what compute-sanitizer found on an H200: with the pivot search's key
    taken through fabs again (the code before the fix in ops/inverse/inverse_kernel.cu),
    the zero-column matrix at n = 40 reads the shared-memory vectors past their end. A copy of
    the kernel file with that one change is built with AddressSanitizer and must fail; the real
    file passes the same input in test_inverse_kernels_emulated_singular."""
    if not _sanitized():
        pytest.skip("the read is found by AddressSanitizer, which this build has not "
                    "(OPBRIDGE_CUDA_HOST_SANITIZE=0, or the compiler cannot link it)")
    src = (ROOT / "ops" / "inverse" / "inverse_kernel.cu").read_text()
    fixed = ["return static_cast<long long>(__float_as_uint(v) & 0x7fffffffu);",
             "return __double_as_longlong(v) & 0x7fffffffffffffffLL;"]
    before = ["return static_cast<long long>(__float_as_uint(fabsf(v)));", "return __double_as_longlong(fabs(v));"]
    for f, b in zip(fixed, before):
        assert src.count(f) == 1, f"the fix is no longer written as {f!r}: update this test"
        src = src.replace(f, b)
    reverted = tmp_path / "inverse" / "inverse_kernel.cu"
    reverted.parent.mkdir()
    reverted.write_text(src)
    for header in ("inverse.cuh", "inverse.h"):
        (reverted.parent / header).write_text((ROOT / "ops" / "inverse" / header).read_text())
    cxx = _compiler()
    objdir = Path(simt_ops).parent
    obj = tmp_path / "inverse_reverted.o"
    flags = _flags(sim=True)
    r = subprocess.run([cxx, *flags, "-x", "c++", "-c", str(reverted), "-o", str(obj)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    others = sorted(o for o in objdir.glob("*.o") if "inverse_kernel" not in o.name)
    exe = tmp_path / "simt_ops_reverted"
    r = subprocess.run([cxx, *flags, str(obj), *map(str, others), "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    a = _singular_batch(rng, "double", 40, 5)
    header = np.array([5, 40, 0, 0], dtype=np.int64)
    (tmp_path / "in.bin").write_bytes(header.tobytes() + a.tobytes())
    r = subprocess.run([str(exe), "inverse", "double", str(SIM_SMS), "90", str(tmp_path / "in.bin"),
                        str(tmp_path / "out.bin")], capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert "heap-buffer-overflow" in r.stderr and "inverse_block_kernel<double, true>" in r.stderr, r.stderr[-3000:]


# -- GroupNorm: every path of the launcher -------------------------------------------------------

# (N, C, S, G, channels_last, compute capability): which path the one-SM device takes.
#   fused:    a group in registers: tiny groups, many per block (M = 10, 32), up to a full
#             512-thread block (M = 8192, the path's limit)
#   cluster:  sm_90: a group over a cluster of blocks (M = 8193, 12288, 65536: 2 to 8 blocks), or
#             split for parallelism (M = 4096 with one group)
#   split:    sm_80 past the fused limit (M = 12288), or past the cluster limit (M = 65540)
#   nhwc:     channels_last (Cg = 1, 2, 3, 8; several tiles; a group over several 256-channel pieces)
GN_PATH_CASES = [
    ("fused-tiny", (2, 6, 5, 3, False, 90)),
    ("fused-small", (3, 8, 16, 4, False, 90)),
    ("fused-one-per-channel", (2, 7, 1, 7, False, 90)),
    ("fused-full-block", (2, 4, 4096, 2, False, 80)),
    ("cluster-1", (1, 2, 2048, 1, False, 90)),
    ("cluster-2-odd", (1, 1, 8193, 1, False, 90)),
    ("cluster-2", (2, 6, 4096, 2, False, 90)),
    ("cluster-8", (1, 4, 16384, 1, False, 90)),
    ("split-sm80", (2, 6, 4096, 2, False, 80)),
    ("split-large", (1, 2, 32770, 1, False, 90)),
    ("nhwc-cg1", (2, 6, 7, 6, True, 90)),
    ("nhwc-cg3", (2, 12, 40, 4, True, 90)),
    ("nhwc-cg8", (1, 64, 300, 8, True, 90)),
    ("nhwc-pieces", (1, 600, 9, 1, True, 90)),
]

GN_TOL = {"double": 1e-11, "float": 3e-5, "half": 3e-3, "bfloat16": 2e-2}


def _group_norm_call(exe, tmp_path, dtype, x_mem, g, w, b, channels_last, activation, cc, offset=0, eps=1e-5):
    """x_mem: the input as laid out in memory, (N, C, S) or (N, S, C) with channels_last."""
    n = x_mem.shape[0]
    c, s = (x_mem.shape[2], x_mem.shape[1]) if channels_last else (x_mem.shape[1], x_mem.shape[2])
    header = np.array([n, c, s, g, int(channels_last), 1 if activation == "silu" else 0, int(w is not None),
                       int(b is not None), offset], dtype=np.int64)
    w_ = np.zeros(c) if w is None else w
    b_ = np.zeros(c) if b is None else b
    payload = header.tobytes() + np.array([eps]).tobytes() + x_mem.tobytes() + w_.tobytes() + b_.tobytes()
    raw, _ = _simt(exe, tmp_path, "group_norm", dtype, payload, cc=cc)
    err = int(np.frombuffer(raw[:8], dtype=np.int64)[0])
    return err, np.frombuffer(raw[8:], dtype=np.float64).reshape(x_mem.shape)


def _gn_inputs(rng, dtype, n, c, s, channels_last):
    shape = (n, s, c) if channels_last else (n, c, s)
    x = _round_to(dtype, rng.standard_normal(shape) * 2.0 + 3.0)
    w = _round_to(dtype, rng.standard_normal(c))
    b = _round_to(dtype, rng.standard_normal(c))
    return x, w, b


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("case", [c for _, c in GN_PATH_CASES], ids=[i for i, _ in GN_PATH_CASES])
def test_group_norm_kernels_emulated(simt_ops, tmp_path, rng, dtype, case):
    """Each path against float64, with 128-bit vectors (aligned) and scalar accesses (x and y one
    element past a 16-byte boundary), with and without the fused SiLU, weight and bias."""
    n, c, s, g, channels_last, cc = case
    x, w, b = _gn_inputs(rng, dtype, n, c, s, channels_last)
    for offset, activation, affine in ((0, "none", True), (1, "silu", True), (0, "silu", False)):
        wa, ba = (w, b) if affine else (None, None)
        err, y = _group_norm_call(simt_ops, tmp_path, dtype, x, g, wa, ba, channels_last, activation, cc, offset)
        assert err == 0
        want = cuda_ref.group_norm_any(x, g, wa, ba, 1e-5, activation, channels_last=channels_last)
        np.testing.assert_allclose(y, want, rtol=0, atol=GN_TOL[dtype] * max(1.0, float(np.abs(want).max())),
                                   err_msg=f"offset={offset}, activation={activation}, affine={affine}")


@pytest.mark.parametrize("dtype", ["half", "bfloat16"])
@pytest.mark.parametrize("case", ["fused-small", "cluster-2", "split-sm80", "nhwc-cg8"])
def test_group_norm_kernels_emulated_16bit(simt_ops, tmp_path, rng, dtype, case):
    """float16 / bfloat16 storage (statistics in float): 8-element vectors and scalar accesses."""
    n, c, s, g, channels_last, cc = dict(GN_PATH_CASES)[case]
    x, w, b = _gn_inputs(rng, dtype, n, c, s, channels_last)
    for offset in (0, 1):
        err, y = _group_norm_call(simt_ops, tmp_path, dtype, x, g, w, b, channels_last, "silu", cc, offset)
        assert err == 0
        want = cuda_ref.group_norm_any(x, g, w, b, 1e-5, "silu", channels_last=channels_last)
        np.testing.assert_allclose(y, want, rtol=0, atol=GN_TOL[dtype] * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("case", ["fused-small", "cluster-2", "split-sm80", "nhwc-cg3"])
def test_group_norm_kernels_emulated_nonfinite(simt_ops, tmp_path, rng, case):
    """A NaN and an inf in one group each: those groups' outputs are NaN, every other group is
    exact (no statistic leaks between groups, in any path's partial sums)."""
    n, c, s, g, channels_last, cc = dict(GN_PATH_CASES)[case]
    x, w, b = _gn_inputs(rng, "float", n, c, s, channels_last)
    xg = np.moveaxis(x, -1, 1) if channels_last else x  # (N, C, S) view
    cg = c // g
    xg[0, 0, 0] = np.nan  # group (0, 0)
    xg[-1, c - 1, s - 1] = np.inf  # group (N - 1, G - 1)
    err, y = _group_norm_call(simt_ops, tmp_path, "float", x, g, w, b, channels_last, "none", cc)
    assert err == 0
    yg = (np.moveaxis(y, -1, 1) if channels_last else y).reshape(n, g, cg, s)
    assert np.isnan(yg[0, 0]).all() and np.isnan(yg[-1, -1]).all()
    want = cuda_ref.group_norm_any(x, g, w, b, 1e-5, "none", channels_last=channels_last)
    wg = (np.moveaxis(want, -1, 1) if channels_last else want).reshape(n, g, cg, s)
    keep = np.ones((n, g), dtype=bool)
    keep[0, 0] = keep[-1, -1] = False
    if keep.any():
        np.testing.assert_allclose(yg[keep], wg[keep], rtol=0,
                                   atol=GN_TOL["float"] * max(1.0, float(np.abs(wg[keep]).max())))


@pytest.mark.parametrize("dtype", ["float", "half"])
@pytest.mark.parametrize("case", ["fused-small", "cluster-2", "split-sm80", "nhwc-cg3"])
def test_group_norm_kernels_emulated_constant_groups_tiny_eps(simt_ops, tmp_path, rng, dtype, case):
    """Groups whose values are all equal, with an eps that float cannot hold (1e-300): 1 / sqrt(var
    + eps) is finite in float64 (1e150) but not in float, and y must be the bias (x - mean = 0),
    as in float64 and on the CPU, not 0 * inf = NaN (found by the CUDA fuzzer on an H200)."""
    n, c, s, g, channels_last, cc = dict(GN_PATH_CASES)[case]
    x, w, b = _gn_inputs(rng, dtype, n, c, s, channels_last)
    xg = np.moveaxis(x, -1, 1) if channels_last else x  # (N, C, S) view
    cg = c // g
    for gi in range(0, g, 2):  # every other group constant (a different constant in each)
        xg[:, gi * cg:(gi + 1) * cg, :] = _round_to(dtype, -5.0 + gi)
    err, y = _group_norm_call(simt_ops, tmp_path, dtype, x, g, w, b, channels_last, "none", cc, eps=1e-300)
    assert err == 0
    want = cuda_ref.group_norm_any(x, g, w, b, 1e-300, "none", channels_last=channels_last)
    assert np.isfinite(want).all()
    np.testing.assert_allclose(y, want, rtol=0, atol=GN_TOL[dtype] * max(1.0, float(np.abs(want).max())))


# -- MultiScaleDeformableAttention: forward and backward launchers --------------------------------


# Every shape in float and double; the 16-bit types (accumulated in a float workspace) on one
# shape with scalar accesses and one with vectors.
MSDA_EMULATED = [(t, c) for t in ("double", "float") for c in range(len(MSDA_CASES))]
MSDA_EMULATED += [(t, c) for t in ("half", "bfloat16") for c in (1, 4)]


@pytest.mark.torch
@pytest.mark.parametrize(("dtype", "case"), MSDA_EMULATED)
def test_ms_deform_attn_kernels_emulated(simt_ops, tmp_path, rng, dtype, case):
    """Forward and backward through the launchers (the backward with the caller's workspace and
    with the launcher's own, stream-ordered one), locations partly outside the maps and some NaN
    / inf, against float64 autograd."""
    n, m, d, lq, p, levels = MSDA_CASES[case]
    value, shapes, starts, loc, attn, grad = _msda_inputs(rng, n, m, d, lq, p, levels, nonfinite=True)
    value, loc, attn, grad = (_round_to(dtype, a) for a in (value, loc, attn, grad))
    want = cuda_ref.ms_deform_attn_with_grads(value, shapes, starts, loc, attn, grad)
    header = np.array([n, value.shape[1], m, d, lq, len(levels), p], dtype=np.int64)
    tol = {"double": 1e-11, "float": 2e-5, "half": 4e-3, "bfloat16": 3e-2}[dtype]
    for own_workspace in (1, 0):
        payload = b"".join(a.tobytes() for a in (header, shapes, starts, np.array([own_workspace], dtype=np.int64),
                                                  value, loc, attn, grad))
        raw, _ = _simt(simt_ops, tmp_path, "ms_deform_attn", dtype, payload)
        errs = np.frombuffer(raw[:16], dtype=np.int64)
        assert (errs == 0).all(), errs
        got = np.frombuffer(raw[16:], dtype=np.float64)
        parts = np.split(got, np.cumsum([x.size for x in want])[:-1])
        for name, g_, w_ in zip(("output", "grad_value", "grad_sampling_locations", "grad_attention_weights"), parts,
                                want):
            w_ = w_.reshape(-1)
            np.testing.assert_allclose(g_, w_, rtol=0, atol=tol * max(1.0, float(np.abs(w_).max())),
                                       err_msg=f"{name}, own_workspace={own_workspace}")


# -- The CUDA compute functions: what the generic torch and ORT kernels run ----------------------
#
# The same calls through each op's registered CUDA compute function (opbridge/kernel.h) instead
# of the launcher: a KernelCall of the call the declaration checked, scratch memory from the
# adapter (exactly the bytes asked for), the status the adapters translate. This is the CUDA glue
# torch and ORT share, run here without a GPU.

STATUS_LINALG = 5  # opbridge::StatusCode::kLinAlgError


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("case", ["fused-small", "cluster-2", "split-sm80", "nhwc-cg8", "nhwc-cg3"])
def test_group_norm_compute_function_emulated(simt_ops, tmp_path, rng, dtype, case):
    """GroupNorm's compute function: its parameters from the checked call (groups, eps, activation,
    the layout the adapter hands over), the workspace from the adapter, each layout's kernels."""
    n, c, s, g, channels_last, cc = dict(GN_PATH_CASES)[case]
    x, w, b = _gn_inputs(rng, dtype, n, c, s, channels_last)
    eps = 3e-4
    header = np.array([n, c, s, g, int(channels_last), 1, 1, 1, 0], dtype=np.int64)
    payload = header.tobytes() + np.array([eps]).tobytes() + x.tobytes() + w.tobytes() + b.tobytes()
    raw, _ = _simt(simt_ops, tmp_path, "group_norm_compute", dtype, payload, cc=cc)
    status = int(np.frombuffer(raw[:8], dtype=np.int64)[0])
    assert status == 0
    y = np.frombuffer(raw[8:], dtype=np.float64).reshape(x.shape)
    want = cuda_ref.group_norm_any(x, g, w, b, eps, "silu", channels_last=channels_last)
    np.testing.assert_allclose(y, want, rtol=0, atol=GN_TOL[dtype] * max(1.0, float(np.abs(want).max())))


def test_group_norm_compute_function_refuses_what_the_declaration_refuses(simt_ops, tmp_path, rng):
    # 3 groups of 8 channels: the declaration's check, before any launch (status kInvalidArgument).
    x, w, b = _gn_inputs(rng, "float", 2, 8, 5, False)
    header = np.array([2, 8, 5, 3, 0, 0, 1, 1, 0], dtype=np.int64)
    payload = header.tobytes() + np.array([1e-5]).tobytes() + x.tobytes() + w.tobytes() + b.tobytes()
    raw, err = _simt(simt_ops, tmp_path, "group_norm_compute", "float", payload)
    assert int(np.frombuffer(raw[:8], dtype=np.int64)[0]) == 1
    assert "num_groups must divide the number of channels C = x.shape[1] = 8, got num_groups = 3" in err
    assert "launches=0" in err


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("n", [2, 5, 40, 65])
def test_inverse_compute_function_emulated(simt_ops, tmp_path, rng, dtype, n):
    """Inverse's compute function: the report word and the workspace in one scratch block, the
    report read back after the launch for on_singular='raise' (a singular matrix: the CPU kernel's
    error, kLinAlgError), nothing read back for 'nan'."""
    batch = 4
    a = _singular_batch(rng, dtype, n, batch) if n > 2 else _round_to(dtype, rng.standard_normal((4, 2, 2)) + 3 * np.eye(2))
    if n == 2:
        a[1, 1] = a[1, 0]
    ok = [0, 3]
    expect = np.linalg.inv(a[ok])
    tol = {"float": 1e-4, "double": 1e-11}[dtype] * max(1.0, float(np.abs(expect).max()))
    for nan_on_singular in (False, True):
        header = np.array([batch, n, int(nan_on_singular), 0], dtype=np.int64)
        raw, err = _simt(simt_ops, tmp_path, "inverse_compute", dtype, header.tobytes() + a.tobytes())
        status = int(np.frombuffer(raw[:8], dtype=np.int64)[0])
        y = np.frombuffer(raw[16:], dtype=np.float64).reshape(a.shape)
        if nan_on_singular:
            assert status == 0
            assert np.isnan(y[1]).all()
            np.testing.assert_allclose(y[ok], expect, rtol=0, atol=tol)
        else:
            assert status == STATUS_LINALG
            assert f"matrix 1 of the batch is singular (U[{n - 1},{n - 1}] == 0)" in err
    # Invertible matrices: no error.
    good = _round_to(dtype, ref.well_conditioned(rng, (3, n, n)))
    header = np.array([3, n, 0, 0], dtype=np.int64)
    raw, _ = _simt(simt_ops, tmp_path, "inverse_compute", dtype, header.tobytes() + good.tobytes())
    assert int(np.frombuffer(raw[:8], dtype=np.int64)[0]) == 0
    want = np.linalg.inv(good)
    np.testing.assert_allclose(np.frombuffer(raw[16:], dtype=np.float64).reshape(good.shape), want, rtol=0,
                               atol={"float": 1e-4, "double": 1e-11}[dtype] * max(1.0, float(np.abs(want).max())))


@pytest.mark.torch
@pytest.mark.parametrize(("dtype", "case"), [("double", 1), ("float", 2), ("half", 4)])
def test_ms_deform_attn_compute_functions_emulated(simt_ops, tmp_path, rng, dtype, case):
    """MultiScaleDeformableAttention's forward and backward compute functions: the level tables on
    the host (host_memory inputs, read by the declaration's checks), the backward's workspace
    from the adapter, against float64 autograd."""
    n, m, d, lq, p, levels = MSDA_CASES[case]
    value, shapes, starts, loc, attn, grad = _msda_inputs(rng, n, m, d, lq, p, levels, nonfinite=True)
    value, loc, attn, grad = (_round_to(dtype, a) for a in (value, loc, attn, grad))
    want = cuda_ref.ms_deform_attn_with_grads(value, shapes, starts, loc, attn, grad)
    header = np.array([n, value.shape[1], m, d, lq, len(levels), p], dtype=np.int64)
    tol = {"double": 1e-11, "float": 2e-5, "half": 4e-3}[dtype]
    payload = b"".join(a.tobytes() for a in (header, shapes, starts, np.array([1], dtype=np.int64), value, loc, attn,
                                              grad))
    raw, _ = _simt(simt_ops, tmp_path, "ms_deform_attn_compute", dtype, payload)
    assert (np.frombuffer(raw[:16], dtype=np.int64) == 0).all()
    parts = np.split(np.frombuffer(raw[16:], dtype=np.float64), np.cumsum([x.size for x in want])[:-1])
    for name, g_, w_ in zip(("output", "grad_value", "grad_sampling_locations", "grad_attention_weights"), parts, want):
        w_ = w_.reshape(-1)
        np.testing.assert_allclose(g_, w_, rtol=0, atol=tol * max(1.0, float(np.abs(w_).max())), err_msg=name)


def test_ms_deform_attn_compute_function_checks_the_level_tables(simt_ops, tmp_path, rng):
    # A start index that is not the sum of the levels before it: refused by the declaration (the
    # tables are host memory there), the CPU's message, no launch.
    n, m, d, lq, p, levels = MSDA_CASES[1]
    value, shapes, starts, loc, attn, grad = _msda_inputs(rng, n, m, d, lq, p, levels, nonfinite=False)
    starts = starts.copy()
    starts[1] += 1
    header = np.array([n, value.shape[1], m, d, lq, len(levels), p], dtype=np.int64)
    payload = b"".join(a.tobytes() for a in (header, shapes, starts, np.array([1], dtype=np.int64), value, loc, attn,
                                              grad))
    raw, err = _simt(simt_ops, tmp_path, "ms_deform_attn_compute", "float", payload)
    assert (np.frombuffer(raw[:16], dtype=np.int64) == 1).all()
    assert f"level_start_index[1] must be {starts[1] - 1} (the sum of H * W of the levels before it)" in err
    assert "launches=0" in err


# -- The point-cloud ops, through their CUDA compute functions (simt_ops' generic runner) ---------

_ELEM = {"float32": 1, "float64": 11, "float16": 10, "bfloat16": 16, "int64": 7, "int32": 6}


def _run_declared(exe, tmp_path, op, inputs, attrs, outputs):
    """Runs op's CUDA compute function on (name of dtype, array) inputs and attribute values;
    returns its status and its outputs, shaped like `outputs` (arrays)."""
    payload = np.array([len(inputs)], np.int64).tobytes()
    for dtype, a in inputs:
        payload += np.array([_ELEM[dtype], a.ndim, *a.shape], np.int64).tobytes() + a.astype(np.float64).tobytes()
    payload += np.array([len(attrs)], np.int64).tobytes() + np.array(attrs, np.float64).tobytes()
    raw, err = _simt(exe, tmp_path, op, "float", payload)
    status = int(np.frombuffer(raw[:8], np.int64)[0])
    got, at = [], 8
    for o in outputs:
        got.append(np.frombuffer(raw[at:at + 8 * o.size], np.float64).reshape(o.shape))
        at += 8 * o.size
    return status, got, err


_POINT_DTYPES = ["float32", "float64", "float16", "bfloat16"]


def _grid(rng, *shape):
    return rng.integers(-32, 33, size=(*shape, 3)) / 16.0  # exact in every dtype, with ties


@pytest.mark.parametrize("dtype", _POINT_DTYPES)
def test_point_cloud_search_kernels(simt_ops, tmp_path, rng, dtype):
    """furthest_point_sample, ball_query, knn and three_nn on the emulated device give the CPU
    kernels' indices exactly (same rounding, ties to the lowest index, a NaN distance as +inf),
    and three_nn's distances."""
    torch = pytest.importorskip("torch")
    import opbridge.ops  # noqa: F401

    tdt = getattr(torch, dtype)
    xyz, centers = _grid(rng, 2, 37), _grid(rng, 2, 9)
    xyz[1, 5, 2] = np.nan
    xt, ct = torch.from_numpy(xyz).to(tdt), torch.from_numpy(centers).to(tdt)
    cases = [
        ("furthest_point_sample", [xyz], [9], torch.ops.opbridge.furthest_point_sample(xt, 9)),
        ("ball_query", [xyz, centers], [0.25, 1.0, 6], torch.ops.opbridge.ball_query(0.25, 1.0, 6, xt, ct)),
        ("knn", [xyz, centers], [7], torch.ops.opbridge.knn(7, xt, ct)),
        ("three_nn", [centers, xyz], [], torch.ops.opbridge.three_nn(ct, xt)),
    ]
    for op, arrays, attrs, want in cases:
        want = [w.double().numpy() for w in (want if isinstance(want, tuple) else (want,))]
        status, got, err = _run_declared(simt_ops, tmp_path, op, [(dtype, a) for a in arrays], attrs, want)
        assert status == 0, err
        np.testing.assert_array_equal(got[-1], want[-1], err_msg=op)
        if op == "three_nn":
            np.testing.assert_allclose(got[0], want[0], rtol=1e-6, err_msg=op)


@pytest.mark.parametrize("index", ["int64", "int32"])
@pytest.mark.parametrize("dtype", _POINT_DTYPES)
def test_point_cloud_gather_kernels(simt_ops, tmp_path, rng, dtype, index):
    """gather_points, grouping_operation, three_interpolate and their backwards on the emulated
    device against the CPU kernels (the backwards add with atomics: another summation order)."""
    torch = pytest.importorskip("torch")
    import opbridge.ops  # noqa: F401

    tdt, tol = getattr(torch, dtype), {"float32": 1e-5, "float64": 1e-12, "float16": 2e-2, "bfloat16": 5e-2}[dtype]
    ops = torch.ops.opbridge
    f = rng.standard_normal((2, 3, 11))
    i2, i3 = rng.integers(0, 11, (2, 5)), rng.integers(0, 11, (2, 4, 3))
    w = rng.uniform(0.1, 1, (2, 4, 3))
    g2, g3, g4 = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4, 3))
    t = {k: torch.from_numpy(v).to(tdt) for k, v in {"f": f, "w": w, "g2": g2, "g3": g3, "g4": g4}.items()}
    it = {k: torch.from_numpy(v).to(getattr(torch, index)) for k, v in {"i2": i2, "i3": i3}.items()}
    cases = [
        ("gather_points", [(dtype, f), (index, i2)], ops.gather_points(t["f"], it["i2"])),
        ("gather_points_backward", [(dtype, g2), (dtype, f), (index, i2)],
         ops.gather_points_backward(t["g2"], t["f"], it["i2"])),
        ("grouping_operation", [(dtype, f), (index, i3)], ops.grouping_operation(t["f"], it["i3"])),
        ("grouping_operation_backward", [(dtype, g4), (dtype, f), (index, i3)],
         ops.grouping_operation_backward(t["g4"], t["f"], it["i3"])),
        ("three_interpolate", [(dtype, f), (index, i3), (dtype, w)], ops.three_interpolate(t["f"], it["i3"], t["w"])),
        ("three_interpolate_backward", [(dtype, g3), (dtype, f), (index, i3), (dtype, w)],
         ops.three_interpolate_backward(t["g3"], t["f"], it["i3"], t["w"])),
    ]
    for op, inputs, want in cases:
        want = [x.double().numpy() for x in (want if isinstance(want, (tuple, list)) else (want,))]
        status, got, err = _run_declared(simt_ops, tmp_path, op, inputs, [], want)
        assert status == 0, err
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=op)


# -- Every kernel ran --------------------------------------------------------------------------


def test_every_kernel_launched_in_emulation(simt_ops, request):
    """Every __global__ function of ops/ (each instantiation the launchers can choose, as
    linked into simt_ops) was launched by the emulated tests above: no kernel path goes untested
    on the host. Measured over this file's tests, so it runs last and only with all of them."""
    emulated = [it for it in request.session.items
                if it.module is request.module and "simt_ops" in getattr(it, "fixturenames", ())
                and it is not request.node]
    everything = {name for name, f in vars(request.module).items() if name.startswith("test_") and callable(f)
                  and "simt_ops" in inspect.signature(f).parameters and name != request.node.originalname}
    if {it.originalname for it in emulated} != everything:
        pytest.skip("kernel coverage is measured over the whole of tests/cuda_ops/test_cuda_host.py")
    names = set()
    for src in KERNEL_FILES:
        names.update(re.findall(r"__global__ void (?:__launch_bounds__\([^)]*\)\s*)?(\w+)\(", src.read_text()))
    nm = subprocess.run(["nm", "-C", "--defined-only", str(simt_ops)], capture_output=True, text=True, check=True)
    kernels = {}
    for line in nm.stdout.splitlines():
        addr, kind, name = line.split(" ", 2)
        if kind in "tTwW" and any(f"::{k}<" in name or f"::{k}(" in name for k in names) and "{lambda" not in name:
            kernels[int(addr, 16)] = name
    assert len(kernels) >= len(names), (sorted(names), len(kernels))
    missed = sorted(name for addr, name in kernels.items() if addr not in _LAUNCHED)
    assert not missed, "kernels no emulated test launched:\n" + "\n".join(missed)
