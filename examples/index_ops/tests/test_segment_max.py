"""Tests of index_ops::segment_max: against a float64 reference written here, independently of the kernel,
plus everything opbridge.testing.check_op runs (torch.library.opcheck, gradcheck, gradgradcheck,
export with both exporters, ONNX Runtime against torch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opbridge.testing
from opbridge.ops import translate_errors
import index_ops
import index_ops.ops  # noqa: F401  (the torch side: extension, fake kernels, autograd)


def reference(values, segment_ids, num_segments):
    """float64 loops: per segment and column the largest value (0 for none) and its first row (-1)."""
    v, ids = np.asarray(values, dtype=np.float64), np.asarray(segment_ids)
    y = np.zeros((num_segments, v.shape[1]))
    argmax = np.full((num_segments, v.shape[1]), -1, dtype=np.int64)
    for i in range(v.shape[0]):
        for c in range(v.shape[1]):
            s = ids[i]
            if argmax[s, c] < 0 or v[i, c] > y[s, c]:
                y[s, c], argmax[s, c] = v[i, c], i
    return y, argmax


def samples():
    """Fresh random inputs every run (never all zeros; distinct values, so gradients are defined):
    an empty segment, a single row."""
    return [
        (torch.randn(7, 3), torch.tensor([0, 2, 2, 0, 1, 2, 0]), 4),
        (torch.randn(1, 5), torch.tensor([1]), 2),
    ]


def test_check_op():
    opbridge.testing.check_op("index_ops::segment_max", reference, samples())


def test_gradient_uses_the_saved_argmax():
    values = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([1, 0, 1, 1, 0, 2])
    y, argmax = index_ops.segment_max(values, ids, 3)
    assert not argmax.requires_grad and argmax.dtype == torch.int64
    grad = torch.randn_like(y)
    (got,) = torch.autograd.grad(y, values, grad)
    want = np.zeros((6, 4))
    _, am = reference(values.detach().numpy(), ids.numpy(), 3)
    for s in range(3):
        for c in range(4):
            want[am[s, c], c] += grad[s, c].item()
    np.testing.assert_array_equal(got.numpy(), want)


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"segment_ids\[1\] = 3 is outside \[0, 3\)"):
        index_ops.segment_max(torch.randn(2, 4), torch.tensor([0, 3]), 3)
    # The backward op called directly checks the argmax it indexes rows with.
    with pytest.raises(ValueError, match=r"argmax\[0\] = 2 is outside \[-1, 2\)"):
        backward = translate_errors(torch.ops.index_ops.segment_max_backward.default)
        backward(torch.randn(3, 4), torch.full((3, 4), 2), torch.randn(2, 4), torch.tensor([0, 1]), 3)


def test_ort_without_torch_api():
    # The ORT side of the package: a library path and session options, no torch involved.
    import onnxruntime as ort

    assert index_ops.get_library_path().endswith("libindex_ops_ort.so")
    assert isinstance(index_ops.session_options(), ort.SessionOptions)
