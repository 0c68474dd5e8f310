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
