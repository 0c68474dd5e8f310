"""Tests of myops::rms_norm: against a float64 reference written here, independently of the
kernel, plus everything opbridge.testing.check_op runs (torch.library.opcheck, gradcheck,
gradgradcheck, export with both exporters, ONNX Runtime against torch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import myops
import myops.ops  # noqa: F401  (the torch side: extension, fake kernels, autograd)
import opbridge.testing


def reference(x, weight, eps=1e-5):
    """float64 numpy: x / sqrt(mean(x^2) + eps) * weight over the last dimension."""
    eps = float(np.float32(eps))  # float attributes are float32 in every call, as ONNX stores them
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * np.asarray(weight, dtype=np.float64)


def samples():
    """Fresh random inputs every run (never all zeros): several ranks, eps default and not, a
    row of one channel, rows of large and of tiny values."""
    return [
        (torch.randn(4, 8), torch.randn(8)),
        (torch.randn(2, 3, 16) * 50, torch.rand(16) + 0.5, 1e-3),
        (torch.randn(6), torch.randn(6), 0.25),
        (torch.randn(5, 1) * 1e-3, torch.randn(1)),
    ]


def test_check_op():
    opbridge.testing.check_op("myops::rms_norm", reference, samples())


def test_matches_torch_rms_norm():
    x, w = torch.randn(3, 5, 32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)
    expected = torch.nn.functional.rms_norm(x, (32,), w, eps=1e-5)
    torch.testing.assert_close(myops.rms_norm(x, w), expected, rtol=1e-12, atol=1e-12)


def test_gradient_graph_is_built_in_cpp():
    # register_autograd(..., backward_op=...): where opbridge's fast path is loaded (the torch
    # release opbridge was built with), the autograd node is made in C++ and calls rms_norm_backward.
    if not hasattr(torch.ops.opbridge, "_no_grad_fast_path"):
        pytest.skip("opbridge's fast-path library is not loaded in this torch release")
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    y = myops.rms_norm(x, torch.randn(8, dtype=torch.float64))
    assert y.grad_fn.name() == "OpbridgeBackward[myops::rms_norm]"


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"weight must have C = x.shape\[-1\] = 4"):
        myops.rms_norm(torch.randn(2, 4), torch.randn(3))
    with pytest.raises(ValueError, match="eps must be finite and >= 0"):
        myops.rms_norm(torch.randn(2, 4), torch.randn(4), -1.0)
    with pytest.raises(TypeError, match="x"):
        myops.rms_norm(torch.ones(2, 4, dtype=torch.int64), torch.ones(4, dtype=torch.int64))


def test_ort_without_torch_api():
    # The ORT side of the package: a library path and session options, no torch involved.
    import onnxruntime as ort

    assert myops.get_library_path().endswith("libmyops_ort.so")
    assert isinstance(myops.session_options(), ort.SessionOptions)
