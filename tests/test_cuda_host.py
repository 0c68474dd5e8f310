"""The CUDA kernels' index and arithmetic logic, checked on the CPU.

The per-thread math of the MultiScaleDeformableAttention kernels and the work decomposition of
the channels_last GroupNorm kernels live in host-device headers (ms_deform_attn_math.cuh,
group_norm_nhwc.cuh). tests/cuda_host/ compiles them with the host compiler into small programs
that run them over every thread / lane / tile of the kernels' decomposition (grid-stride loops,
lane shares summed as the shuffles do, atomics as additions), and these tests compare the results
with float64 references. This runs everywhere; the device tests in tests/test_cuda.py run the
real kernels where there is a GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import cuda_ref

ROOT = Path(__file__).resolve().parent.parent
HOST = ROOT / "tests" / "cuda_host"


@pytest.fixture(scope="module")
def host_programs(tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("needs a C++ compiler")
    out = tmp_path_factory.mktemp("cuda_host")
    progs = {}
    for name in ("msda_host", "gn_nhwc_host"):
        exe = out / name
        cmd = [cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'cuda'}",
               f"-I{ROOT / 'cpp' / 'include'}", str(HOST / f"{name}.cpp"), "-o", str(exe)]
        if os.environ.get("OPBRIDGE_CUDA_HOST_SANITIZE") == "1":
            # Every load and store of the kernels' index math checked by AddressSanitizer and
            # UndefinedBehaviorSanitizer (a read past a tap's row or a tensor's end fails the test).
            cmd += ["-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
        result = subprocess.run(cmd, capture_output=True, text=True)
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
