"""Inputs and tolerances for the MultiScaleDeformableAttention tests (numpy only, no torch).

Tolerances are the op's documented accuracy (docs/ms_deform_attn.md): against the float64
reference on the same (rounded) inputs, each result r satisfies

    |r - ref| <= TOL_SUM[dtype] * terms + TOL_COORD[dtype] * coords + tiny

with terms / coords from reference.ms_deform_attn_bounds (the magnitude sum of the terms of r,
and its sensitivity to the rounding of the pixel coordinates x * W - 0.5, computed in float for
every type but float64).
"""

from __future__ import annotations

import numpy as np

from helpers import reference

try:
    import ml_dtypes

    BF16 = ml_dtypes.bfloat16
except ImportError:  # pragma: no cover - ml_dtypes is a test requirement
    BF16 = None

DTYPES = ("float32", "float64", "float16", "bfloat16")
# Sums in float (float64 for float64): 64 terms' worth of float rounding; the 16-bit types round
# the result once more (2^-11, 2^-8 relative).
TOL_SUM = {"float64": 1e-13, "float32": 1e-5, "float16": 1.2e-3, "bfloat16": 8e-3}
TOL_COORD = {"float64": 4 * 2.0**-52, "float32": 4 * 2.0**-23, "float16": 4 * 2.0**-23, "bfloat16": 4 * 2.0**-23}
# Gradients: sums over up to thousands of terms (grad_value), rounded once to the type.
TOL_GRAD = {"float64": 1e-12, "float32": 4e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
TINY = {"float64": 1e-300, "float32": 1e-37, "float16": 1e-7, "bfloat16": 1e-37}


def np_dtype(name: str):
    return BF16 if name == "bfloat16" else np.dtype(name)


def level_tensors(levels):
    """spatial_shapes (L, 2) and level_start_index (L,) (int64) of a list of (H, W)."""
    shapes = np.array(levels, np.int64).reshape(-1, 2)
    starts = np.concatenate([[0], np.cumsum(shapes.prod(axis=1))[:-1]]).astype(np.int64)
    return shapes, starts


def random_levels(rng, count, max_side=9):
    """`count` levels of random, mostly non-square sizes, one of them 1 x 1 (when count > 1)."""
    levels = [(int(rng.integers(1, max_side + 1)), int(rng.integers(1, max_side + 1))) for _ in range(count)]
    if count > 1:
        levels[int(rng.integers(count))] = (1, 1)
    return levels


def make_inputs(rng, levels, N, M, D, Lq, P, dtype="float64", lo=-0.25, hi=1.25):
    """(value, spatial_shapes, level_start_index, sampling_locations, attention_weights): value and
    weights standard normal (weights of any sign: the op does not assume a softmax), locations
    uniform in [lo, hi] (partly outside the maps), all rounded to `dtype`."""
    shapes, starts = level_tensors(levels)
    S = int(shapes.prod(axis=1).sum())
    L = len(levels)
    t = np_dtype(dtype)
    value = rng.standard_normal((N, S, M, D)).astype(t)
    loc = rng.uniform(lo, hi, (N, Lq, M, L, P, 2)).astype(t)
    aw = rng.standard_normal((N, Lq, M, L, P)).astype(t)
    return value, shapes, starts, loc, aw


def f64(a):
    return np.asarray(a).astype(np.float64)


def forward_allowance(args, dtype):
    """Elementwise allowed |error| of the forward output for inputs `args` (already rounded)."""
    terms, coords = reference.ms_deform_attn_bounds(*[f64(a) if i in (0, 3, 4) else a for i, a in enumerate(args)])
    return TOL_SUM[dtype] * terms + TOL_COORD[dtype] * coords + TINY[dtype]


def near_integral_pixel(spatial_shapes, sampling_locations, dtype):
    """(N, Lq, M, L, P, 2) mask of the location components whose pixel coordinate (x * W - 0.5,
    y * H - 0.5) lies within the kernel's rounding of an integer: the derivative along that
    coordinate jumps there (other taps), and either side's value is right."""
    loc = f64(sampling_locations)
    hw = np.asarray(spatial_shapes, np.float64)
    size = hw[:, ::-1][:, None, :]  # (L, 1, 2): W for x, H for y
    with np.errstate(invalid="ignore", over="ignore"):
        pix = loc * size - 0.5
        dist = np.abs(pix - np.round(pix))
        return np.nan_to_num(dist, nan=1.0) <= 4 * TOL_COORD[dtype] * (np.abs(pix) + 1)


def backward_allowances(grad_output, args, dtype):
    """Allowed |error| of (grad_value, grad_sampling_locations, grad_attention_weights)."""
    a = [f64(x) if i in (0, 3, 4) else x for i, x in enumerate(args)]
    gv, gl, ga, coords, gv_coords = reference.ms_deform_attn_backward_bounds(f64(grad_output), *a)
    t, c = TOL_GRAD[dtype], TOL_COORD[dtype]
    # The tap fractions themselves carry the coordinates' rounding into every gradient.
    gl_allowed = np.where(near_integral_pixel(args[1], args[3], dtype), np.inf, t * gl + c * coords + TINY[dtype])
    return (t * gv + c * gv_coords + TINY[dtype], gl_allowed, t * ga + c * coords[..., 0] + TINY[dtype])


def assert_within(got, ref, allowed, what="output"):
    """Elementwise |got - ref| <= allowed, NaN exactly where the reference has NaN, same infinities."""
    got = f64(got)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    nan_g, nan_r = np.isnan(got), np.isnan(ref)
    assert (nan_g == nan_r).all(), f"{what}: NaN pattern differs at {np.argwhere(nan_g != nan_r)[:5].tolist()}"
    fin = np.isfinite(ref)
    assert (got[~fin & ~nan_r] == ref[~fin & ~nan_r]).all(), f"{what}: infinities differ"
    err = np.where(fin, np.abs(got - ref), 0.0)
    allowed = np.broadcast_to(allowed, ref.shape)
    bad = err > allowed
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {ref.size} elements off; first at {i}: got {got[i]!r}, "
                             f"reference {ref[i]!r}, |diff| {err[i]:.3g} > allowed {allowed[i]:.3g}")
