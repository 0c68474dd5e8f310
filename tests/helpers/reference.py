"""float64 numpy references for every op (independent of the code under test)."""

from __future__ import annotations

import numpy as np


def _groups(x, num_groups):
    x = np.asarray(x, dtype=np.float64)
    return x.reshape(x.shape[0], num_groups, -1)


# NaN and inf inputs are legitimate (their propagation is tested): no warnings for them.
_QUIET = dict(invalid="ignore", divide="ignore", over="ignore")


def group_norm_stats(x, num_groups, eps=1e-5):
    """Per-group mean and 1/sqrt(var + eps) of x (N, C, *), each (N, G, 1), in float64.

    The deviations are taken from each group's first element before averaging (the same
    numbers mathematically), so a constant group has exactly zero variance, as it should, even
    where summing n copies of a float64 value would round."""
    g = _groups(x, num_groups)
    with np.errstate(**_QUIET):
        shift = g[:, :, :1]
        d = g - shift
        dmean = d.mean(axis=2, keepdims=True)
        var = ((d - dmean) ** 2).mean(axis=2, keepdims=True)
        return shift + dmean, 1.0 / np.sqrt(var + eps)


def silu(z):
    """SiLU in float64: z * sigmoid(z), written z / (1 + exp(-z)) (so silu(-inf) = NaN, as torch)."""
    z = np.asarray(z, dtype=np.float64)
    with np.errstate(**_QUIET):
        return z / (1.0 + np.exp(-z))


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, activation="none"):
    """GroupNorm in float64: x (N, C, *), per-channel weight/bias, then the activation ("none" or
    "silu")."""
    x = np.asarray(x, dtype=np.float64)
    n, c = x.shape[:2]
    g = _groups(x, num_groups)
    bshape = (1, c) + (1,) * (x.ndim - 2)
    with np.errstate(**_QUIET):
        shift = g[:, :, :1]
        d = g - shift
        dmean = d.mean(axis=2, keepdims=True)
        dev = d - dmean
        var = (dev**2).mean(axis=2, keepdims=True)
        y = (dev / np.sqrt(var + eps)).reshape(x.shape)
        if weight is not None:
            y = y * np.asarray(weight, dtype=np.float64).reshape(bshape)
        if bias is not None:
            y = y + np.asarray(bias, dtype=np.float64).reshape(bshape)
    if activation == "silu":
        return silu(y)
    assert activation == "none", activation
    return y


def group_norm_backward(x, num_groups, weight, dy, eps=1e-5, bias=None, activation="none"):
    """Gradients (dx, dweight, dbias) of sum(group_norm(x, num_groups, weight, bias, eps,
    activation) * dy) in float64; weight None means 1 (dweight is then still returned, as for
    weight = 1). SiLU's derivative: s * (1 + z * (1 - s)), s = sigmoid(z), z the pre-activation."""
    x = np.asarray(x, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    n, c = x.shape[:2]
    bshape = (1, c) + (1,) * (x.ndim - 2)
    w = np.ones(c) if weight is None else np.asarray(weight, dtype=np.float64)
    mean, rstd = group_norm_stats(x, num_groups, eps)
    xhat = ((_groups(x, num_groups) - mean) * rstd).reshape(x.shape)
    if activation == "silu":
        z = xhat * w.reshape(bshape)
        if bias is not None:
            z = z + np.asarray(bias, dtype=np.float64).reshape(bshape)
        s = 1.0 / (1.0 + np.exp(-z))
        dy = dy * (s * (1.0 + z * (1.0 - s)))
    red = (0,) + tuple(range(2, x.ndim))
    dweight = (dy * xhat).sum(axis=red)
    dbias = dy.sum(axis=red)
    dxhat = _groups(dy * w.reshape(bshape), num_groups)
    xh = _groups(xhat, num_groups)
    dx = rstd * (dxhat - dxhat.mean(axis=2, keepdims=True) - xh * (dxhat * xh).mean(axis=2, keepdims=True))
    return dx.reshape(x.shape), dweight, dbias


def inverse(x):
    """Matrix inverse in float64 of each matrix of x (*, n, n) (LAPACK through numpy)."""
    return np.linalg.inv(np.asarray(x, dtype=np.float64))


def well_conditioned(rng, shape, max_cond=100.0):
    """Random matrices (*shape) (..., n, n) in float64: standard normal plus 2 sqrt(n) on the
    diagonal, any matrix whose 2-norm condition number passes max_cond drawn again.

    The shift alone keeps most of them near cond 3-5, but not all: one 8 x 8 matrix in ~10^5
    comes out near 10^4, where float32 can only keep 3 digits of its inverse (a tolerance meant
    for well-conditioned matrices then fails for the data, not the kernel)."""
    *batch, n, n2 = shape
    assert n == n2, shape
    a = rng.standard_normal(shape) + np.eye(n) * (2.0 * np.sqrt(n))
    flat = a.reshape(-1, n, n)
    for _ in range(100):
        bad = np.linalg.cond(flat) > max_cond if flat.size else np.zeros(0, dtype=bool)
        if not bad.any():
            return a
        flat[bad] = rng.standard_normal((int(bad.sum()), n, n)) + np.eye(n) * (2.0 * np.sqrt(n))
    raise AssertionError(f"no {n} x {n} matrix with condition number <= {max_cond} in 100 draws")


# ---- MultiScaleDeformableAttention ------------------------------------------------------------

# The four bilinear taps of a sample: (dy, dx) from (y0, x0).
_MSDA_TAPS = ((0, 0), (0, 1), (1, 0), (1, 1))


def _msda_level(value, spatial_shapes, level_start_index, sampling_locations, l):
    """Per-level pieces shared by forward and backward, straight from the definition: level l's
    map (N, H, W, M, D), pixel coordinates x = loc_x * W - 0.5, y = loc_y * H - 0.5 of its samples
    (N, Lq, M, P), whether each sample has any tap on the map (NaN/inf: no), and its fractions."""
    h, w = (int(v) for v in spatial_shapes[l])
    start = int(level_start_index[l])
    n, _, m, d = value.shape
    vl = value[:, start:start + h * w].reshape(n, h, w, m, d)
    with np.errstate(**_QUIET):
        x = sampling_locations[:, :, :, l, :, 0] * w - 0.5
        y = sampling_locations[:, :, :, l, :, 1] * h - 0.5
        inside = (x > -1) & (x < w) & (y > -1) & (y < h)
        x0 = np.floor(np.where(inside, x, 0.0))
        y0 = np.floor(np.where(inside, y, 0.0))
    return vl, h, w, x - x0, y - y0, x0.astype(np.int64), y0.astype(np.int64), inside


def _msda_tap(vl, h, w, x0, y0, inside, dy, dx):
    """One tap of every sample: its value rows (N, Lq, M, P, D), 0 where off the map, and the mask."""
    n, _, _, m, _ = vl.shape
    xi, yi = x0 + dx, y0 + dy
    on = inside & (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
    ni = np.arange(n).reshape(n, 1, 1, 1)
    mi = np.arange(m).reshape(1, 1, m, 1)
    rows = vl[ni, np.where(on, yi, 0), np.where(on, xi, 0), mi]
    return np.where(on[..., None], rows, 0.0), on


def _msda_bilinear(fx, fy, dy, dx):
    return (fy if dy else 1.0 - fy) * (fx if dx else 1.0 - fx)


def _msda_inputs(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    f = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    return (f(value), np.asarray(spatial_shapes, np.int64), np.asarray(level_start_index, np.int64),
            f(sampling_locations), f(attention_weights))


def ms_deform_attn(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    """Multi-scale deformable attention in float64 -> (N, Lq, M * D).

    out[n, q, m, :] = sum over levels l and points p of a[n, q, m, l, p] * bilinear sample of
    level l's (H, W) map of value[n, :, m, :] at pixel (x * W - 0.5, y * H - 0.5), taps off the
    map read as 0. A sample with no tap on the map (x <= -1, x >= W, same for y) or a NaN/inf
    coordinate contributes exactly 0, whatever its weight; within a sample, every on-map tap
    contributes weight * value (so NaN values or weights propagate)."""
    value, spatial_shapes, level_start_index, loc, aw = _msda_inputs(value, spatial_shapes, level_start_index,
                                                                     sampling_locations, attention_weights)
    n, _, m, d = value.shape
    lq = loc.shape[1]
    out = np.zeros((n, lq, m, d))
    with np.errstate(**_QUIET):
        for l in range(spatial_shapes.shape[0]):
            vl, h, w, fx, fy, x0, y0, inside = _msda_level(value, spatial_shapes, level_start_index, loc, l)
            a = aw[:, :, :, l, :]
            for dy, dx in _MSDA_TAPS:
                rows, on = _msda_tap(vl, h, w, x0, y0, inside, dy, dx)
                weight = np.where(on, a * _msda_bilinear(fx, fy, dy, dx), 0.0)
                out += (weight[..., None] * rows).sum(axis=3)
    return out.reshape(n, lq, m * d)


def ms_deform_attn_backward(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                            attention_weights, _bounds=False):
    """(grad_value, grad_sampling_locations, grad_attention_weights) of
    sum(ms_deform_attn(...) * grad_output) in float64, from the derivative of the bilinear form:
    d/dx = a * W * ((1 - fy) (v01 - v00) + fy (v11 - v10)) (dotted with grad_output), and
    likewise for y; samples with no tap on the map get zero gradients.

    _bounds="terms" (see ms_deform_attn_backward_bounds) gives instead the sums of the magnitudes
    of the terms of each result (value, weights and grad_output as |.|, differences as sums);
    _bounds="coords" the same with every on-map tap's bilinear weight taken as 1 and each weight
    multiplied by its sample's coordinate size."""
    value, spatial_shapes, level_start_index, loc, aw = _msda_inputs(value, spatial_shapes, level_start_index,
                                                                     sampling_locations, attention_weights)
    if _bounds:
        value, aw, grad_output = np.abs(value), np.abs(aw), np.abs(np.asarray(grad_output, np.float64))
    if _bounds == "coords":
        aw = aw * _msda_coordinate_size(spatial_shapes, loc)
    sub = (lambda a, b: a + b) if _bounds else (lambda a, b: a - b)  # noqa: E731
    bilinear = (lambda fx, fy, dy, dx: 1.0) if _bounds == "coords" else _msda_bilinear  # noqa: E731
    n, s, m, d = value.shape
    lq = loc.shape[1]
    go = np.asarray(grad_output, np.float64).reshape(n, lq, m, d)
    grad_value = np.zeros_like(value)
    grad_loc = np.zeros_like(loc)
    grad_aw = np.zeros_like(aw)
    ni = np.broadcast_to(np.arange(n).reshape(n, 1, 1, 1), aw.shape[:3] + aw.shape[4:])
    mi = np.broadcast_to(np.arange(m).reshape(1, 1, m, 1), ni.shape)
    with np.errstate(**_QUIET):
        for l in range(spatial_shapes.shape[0]):
            vl, h, w, fx, fy, x0, y0, inside = _msda_level(value, spatial_shapes, level_start_index, loc, l)
            start = int(level_start_index[l])
            a = aw[:, :, :, l, :]
            g = {}
            for dy, dx in _MSDA_TAPS:
                rows, on = _msda_tap(vl, h, w, x0, y0, inside, dy, dx)
                g[dy, dx] = np.where(on, (rows * go[:, :, :, None, :]).sum(axis=-1), 0.0)
                # grad_value rows of the on-map taps: + a * bilinear weight * grad_output.
                contrib = (a * bilinear(fx, fy, dy, dx))[..., None] * go[:, :, :, None, :]
                pix = start + (y0 + dy) * w + (x0 + dx)
                np.add.at(grad_value, (ni[on], pix[on], mi[on]), contrib[on])
            ga = sum(bilinear(fx, fy, dy, dx) * g[dy, dx] for dy, dx in _MSDA_TAPS)
            gx = a * w * ((1 - fy) * sub(g[0, 1], g[0, 0]) + fy * sub(g[1, 1], g[1, 0]))
            gy = a * h * ((1 - fx) * sub(g[1, 0], g[0, 0]) + fx * sub(g[1, 1], g[0, 1]))
            grad_aw[:, :, :, l, :] = np.where(inside, ga, 0.0)
            grad_loc[:, :, :, l, :, 0] = np.where(inside, gx, 0.0)
            grad_loc[:, :, :, l, :, 1] = np.where(inside, gy, 0.0)
    return grad_value, grad_loc, grad_aw


def _msda_coordinate_size(spatial_shapes, sampling_locations):
    """|x| * W + |y| * H + 1 per sample (N, Lq, M, L, P): the size of the pixel coordinates, whose
    relative rounding (computing x * W - 0.5 in the kernel's type) moves every sample."""
    loc = np.asarray(sampling_locations, np.float64)
    hw = np.asarray(spatial_shapes, np.float64)
    with np.errstate(**_QUIET):
        size = np.abs(loc[..., 0]) * hw[:, 1][:, None] + np.abs(loc[..., 1]) * hw[:, 0][:, None] + 1.0
    return np.where(np.isfinite(size), size, 0.0)


def ms_deform_attn_bounds(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    """(terms, coords), both (N, Lq, M * D): the sum of the magnitudes of the terms a * b * v of each
    output, and of |a| * coordinate size * max |v| of the head (a bound on how far rounding the
    pixel coordinates to a relative eps can move the output, divided by eps). A kernel whose sums
    and coordinates are rounded to eps_sum and eps_coord is within
    c1 * eps_sum * terms + c2 * eps_coord * coords of the exact result."""
    value = np.asarray(value, np.float64)
    aw = np.abs(np.asarray(attention_weights, np.float64))
    with np.errstate(**_QUIET):
        terms = ms_deform_attn(np.abs(value), spatial_shapes, level_start_index, sampling_locations, aw)
        vmax = np.nan_to_num(np.abs(value), nan=0.0, posinf=0.0).max(axis=1, initial=0.0)  # (N, M, D)
        per_query = (aw * _msda_coordinate_size(spatial_shapes, sampling_locations)).sum(axis=(3, 4))  # N, Lq, M
    coords = per_query[..., None] * vmax[:, None, :, :]
    return np.nan_to_num(terms, nan=np.inf), coords.reshape(terms.shape)


def ms_deform_attn_backward_bounds(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                                   attention_weights):
    """Magnitude sums of the terms of (grad_value, grad_sampling_locations,
    grad_attention_weights), the coordinate sensitivity of the location gradient (its derivative
    along the sample's pixel coordinates times their size: a * W * H * sum of the four taps'
    |grad_output . v|, times |x| W + |y| H + 1), and that of grad_value (each contribution's
    |a * grad_output| times the coordinate size: a bilinear weight moves at most as much as the
    coordinates)."""
    gv, gl, ga = ms_deform_attn_backward(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                                         attention_weights, _bounds="terms")
    gv_coords = ms_deform_attn_backward(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                                        attention_weights, _bounds="coords")[0]
    value = np.abs(np.asarray(value, np.float64))
    go = np.abs(np.asarray(grad_output, np.float64))
    aw = np.abs(np.asarray(attention_weights, np.float64))
    n, s, m, d = value.shape
    lq = go.shape[1]
    with np.errstate(**_QUIET):
        # sum of |grad_output| . max |v| over the head: a bound on each tap's |g|.
        vmax = np.nan_to_num(value, nan=0.0, posinf=0.0).max(axis=1, initial=0.0)  # (N, M, D)
        gmax = (go.reshape(n, lq, m, d) * vmax[:, None]).sum(axis=-1)  # (N, Lq, M)
        hw = np.asarray(spatial_shapes, np.float64)
        size = _msda_coordinate_size(spatial_shapes, sampling_locations)
        mixed = aw * (hw[:, 0] * hw[:, 1])[:, None] * 4 * gmax[..., None, None] * size
    coords = np.stack([mixed, mixed], axis=-1)
    return gv, gl, ga, np.nan_to_num(coords, nan=np.inf), np.nan_to_num(gv_coords, nan=np.inf)
