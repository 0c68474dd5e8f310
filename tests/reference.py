"""float64 numpy references for every op (independent of the code under test)."""

from __future__ import annotations

import numpy as np


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """GroupNorm in float64: x (N, C, *), per-channel weight/bias."""
    x = np.asarray(x, dtype=np.float64)
    n, c = x.shape[:2]
    g = x.reshape(n, num_groups, -1)
    mean = g.mean(axis=2, keepdims=True)
    var = ((g - mean) ** 2).mean(axis=2, keepdims=True)
    y = ((g - mean) / np.sqrt(var + eps)).reshape(x.shape)
    bshape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * np.asarray(weight, dtype=np.float64).reshape(bshape)
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64).reshape(bshape)
    return y


def inverse(x):
    """Matrix inverse in float64 of each matrix of x (*, n, n) (LAPACK through numpy)."""
    return np.linalg.inv(np.asarray(x, dtype=np.float64))
