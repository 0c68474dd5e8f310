"""Tests of shapes::bias_act (an optional input and a string attribute with choices): against a float64
reference written here, plus everything opbridge.testing.check_op runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opbridge.testing
import shapes
import shapes.ops  # noqa: F401  (the torch side: extension, fake kernels, autograd)


def reference(x, bias=None, activation="none"):
    """float64 numpy."""
    z = np.asarray(x, dtype=np.float64) + (0.0 if bias is None else np.asarray(bias, dtype=np.float64))
    return {"none": z, "relu": np.maximum(z, 0), "tanh": np.tanh(z)}[activation]


def samples():
    """Fresh random inputs every run: with and without bias, each activation, several ranks."""
    return [
        (torch.randn(4, 6), torch.randn(6), "tanh"),
        (torch.randn(2, 3, 5), None, "relu"),
        (torch.randn(7), torch.randn(7)),
        (torch.randn(3, 4), None, "none"),
    ]


def test_check_op():
    opbridge.testing.check_op("shapes::bias_act", reference, samples())


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"activation must be 'none', 'relu' or 'tanh', got 'gelu'"):
        shapes.bias_act(torch.randn(2, 3), None, "gelu")
    with pytest.raises(ValueError, match=r"bias must have C = x.shape\[-1\] = 3 elements, got 2"):
        shapes.bias_act(torch.randn(2, 3), torch.randn(2))


def test_gradient_of_bias_only_when_given():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    shapes.bias_act(x, None, "tanh").sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 1 - np.tanh(x.detach().numpy()) ** 2, rtol=1e-12)
