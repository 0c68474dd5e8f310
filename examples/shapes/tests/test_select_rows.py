"""Tests of shapes::select_rows, whose output size the input values decide (rule "?, x[1]"): against a
float64 reference written here, plus everything opbridge.testing.check_op runs (the fake kernel gives
the size as an unbacked symbol; the exported ONNX dimension is symbolic)."""

from __future__ import annotations

import numpy as np
import onnx
import torch

import opbridge.onnx
import opbridge.testing
import shapes
import shapes.ops  # noqa: F401  (the torch side: extension, fake kernels)


def reference(x, threshold=0.0):
    """float64 numpy: a mask of the rows to keep."""
    x = np.asarray(x, dtype=np.float64)
    return x[[bool(x.shape[1]) and row.max() > threshold for row in x]].reshape(-1, x.shape[1])


def samples():
    """Fresh random inputs every run: some rows kept, none kept, all kept."""
    return [(torch.randn(9, 4), 0.5), (torch.randn(3, 2) - 10,), (torch.rand(5, 3) + 1, 0.25)]


def test_check_op():
    opbridge.testing.check_op("shapes::select_rows", reference, samples())


def test_exported_size_is_symbolic_and_ort_sizes_it():
    class M(torch.nn.Module):
        def forward(self, x):
            return shapes.select_rows(x, 0.0)

    x = torch.randn(8, 3)
    proto = opbridge.onnx.export(M(), (x,))
    (out,) = proto.graph.output
    first = out.type.tensor_type.shape.dim[0]
    assert not first.HasField("dim_value"), out  # decided by the values, not a constant
    assert out.type.tensor_type.shape.dim[1].dim_value == 3
    onnx.checker.check_model(proto, full_check=True)
    for rows in (8, 2, 13):
        x = torch.randn(rows, 3, dtype=torch.float32)
        (got,) = opbridge.InferenceSession(proto, sess_options=shapes.session_options()).run(None, {"x": x.numpy()})
        np.testing.assert_allclose(got, reference(x.numpy()), rtol=0, atol=0)
