"""Tests of shapes::window_stats (two outputs, sized by x[1] // window): against a float64 reference
written here, plus everything opbridge.testing.check_op runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opbridge.testing
import shapes
import shapes.ops  # noqa: F401  (the torch side: extension, fake kernels, autograd)


def reference(x, window=2):
    """float64 numpy: explicit loops over the windows."""
    x = np.asarray(x, dtype=np.float64)
    n, W = x.shape[0], x.shape[1] // window
    s, q = np.zeros((n, W)), np.zeros((n, W))
    for w in range(W):
        part = x[:, w * window : (w + 1) * window]
        s[:, w], q[:, w] = part.sum(1), (part**2).sum(1)
    return s, q


def samples():
    """Fresh random inputs every run: a tail left out, exact windows, a window longer than a row."""
    return [(torch.randn(3, 7), 3), (torch.randn(2, 8),), (torch.randn(4, 3), 5)]


def test_check_op():
    opbridge.testing.check_op("shapes::window_stats", reference, samples())


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"window must be >= 1, got 0"):
        shapes.window_stats(torch.randn(2, 4), 0)
    with pytest.raises(ValueError, match=r"x must have rank 2"):
        shapes.window_stats(torch.randn(2, 4, 1))
