"""Tests of myops::rms_norm: against a float64 reference written here, independently of the kernel,
plus everything opbridge.testing.check_op runs (torch.library.opcheck, gradcheck, gradgradcheck,
export with both exporters, ONNX Runtime against torch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opbridge.testing
import myops
import myops.ops  # noqa: F401  (the torch side: extension, fake kernels, autograd)


def reference(x, weight, alpha=1.0):
    """float64 numpy: alpha * x * weight, weight broadcast over the last dimension."""
    return alpha * np.asarray(x, dtype=np.float64) * np.asarray(weight, dtype=np.float64)


def samples():
    """Fresh random inputs every run (never all zeros): several ranks, alpha default and not."""
    return [
        (torch.randn(4, 8), torch.randn(8)),
        (torch.randn(2, 3, 5), torch.randn(5), -0.75),
        (torch.randn(6), torch.rand(6) + 0.5, 2.5),
    ]


def test_check_op():
    opbridge.testing.check_op("myops::rms_norm", reference, samples())


def test_python_function_matches_reference():
    x, w = torch.randn(3, 7, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    np.testing.assert_allclose(myops.rms_norm(x, w, 0.5).numpy(), reference(x.numpy(), w.numpy(), 0.5), rtol=1e-12)


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"weight must have C = x.shape\[-1\] = 4"):
        myops.rms_norm(torch.randn(2, 4), torch.randn(3))
    with pytest.raises(TypeError, match="x"):
        myops.rms_norm(torch.ones(2, 4, dtype=torch.int64), torch.ones(4, dtype=torch.int64))


def test_ort_without_torch_api():
    # The ORT side of the package: a library path and session options, no torch involved.
    import onnxruntime as ort

    assert myops.get_library_path().endswith("libmyops_ort.so")
    assert isinstance(myops.session_options(), ort.SessionOptions)
