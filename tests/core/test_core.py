"""opbridge._core: build information and the CPU kernels on numpy arrays (no torch, no ORT)."""

from __future__ import annotations

import numpy as np
import pytest

from opbridge import _core
from helpers.reference import group_norm as ref_group_norm


def test_build_info():
    info = _core.build_info
    import opbridge

    assert info["version"] == opbridge.__version__
    assert info["ort_api_version"] >= 17
    assert info["eigen_version"].startswith("3.")
    assert isinstance(info["cuda"], bool)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("shape,groups", [((3, 2, 1, 2), 2), ((2, 64, 16, 16), 32), ((4, 6), 3), ((2, 4, 3, 2, 5), 2)])
def test_group_norm_kernel(rng, dtype, tol, shape, groups):
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.uniform(0.5, 2, shape[1]).astype(dtype)
    b = rng.standard_normal(shape[1]).astype(dtype)
    y = _core.group_norm(x, groups, w, b, 1e-4)
    assert y.dtype == dtype and y.shape == x.shape
    # eps as the op uses it: float32, as ONNX stores float attributes (docs/declarations.md).
    np.testing.assert_allclose(y, ref_group_norm(x, groups, w, b, float(np.float32(1e-4))), rtol=tol, atol=tol)
    np.testing.assert_allclose(_core.group_norm(x, groups), ref_group_norm(x, groups, eps=float(np.float32(1e-5))),
                               rtol=tol, atol=tol)


def test_group_norm_float16(rng):
    x = rng.standard_normal((2, 8, 33)).astype(np.float16)
    y = _core.group_norm(x, 4)
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype(np.float64), ref_group_norm(x, 4), rtol=0, atol=4e-3)


def test_group_norm_errors(rng):
    x = rng.standard_normal((2, 6, 3)).astype(np.float32)
    with pytest.raises(ValueError, match="num_groups must divide"):
        _core.group_norm(x, 4)
    with pytest.raises(ValueError, match="weight must have C = 6"):
        _core.group_norm(x, 3, np.ones(5, np.float32))
    with pytest.raises(TypeError, match="x must be a float32"):
        _core.group_norm(x.astype(np.int32), 3)
