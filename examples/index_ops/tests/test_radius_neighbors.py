"""Tests of index_ops::radius_neighbors: against a float64 reference written here, independently of the kernel,
plus everything opbridge.testing.check_op runs (torch.library.opcheck, gradcheck, gradgradcheck,
export with both exporters, ONNX Runtime against torch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opbridge.testing
import index_ops
import index_ops.ops  # noqa: F401  (the torch side: extension, fake kernels, autograd)


def reference(points, queries, radius, k):
    """float64 loops: the first k points at distance < radius (as float32, the rule for float attributes)."""
    p, q = np.asarray(points, dtype=np.float64), np.asarray(queries, dtype=np.float64)
    r = float(np.float32(radius))
    out = np.full((q.shape[0], k), -1, dtype=np.int64)
    for j in range(q.shape[0]):
        found = [i for i in range(p.shape[0]) if np.sqrt(((p[i] - q[j]) ** 2).sum()) < r][:k]
        out[j, : len(found)] = found
    return out


def grid(*shape):
    # Multiples of 1/16: every distance compares exactly in float32 and float64 (ties at the radius included).
    return torch.from_numpy(np.random.default_rng().integers(-16, 17, size=shape) / 16.0)


def samples():
    """Fresh random inputs every run: 3-D and 2-D points, queries with fewer than k neighbours."""
    return [(grid(40, 3), grid(6, 3), 0.5, 4), (grid(9, 2), grid(3, 2), 0.25, 2)]


def test_check_op():
    opbridge.testing.check_op("index_ops::radius_neighbors", reference, samples())


def test_radius_is_float32_in_torch_as_in_onnx_runtime():
    # A point between 0.3 and float32(0.3) = 0.30000001192092896 from the query: inside for ONNX
    # Runtime, which stores radius=0.3 as float32, so inside for torch too.
    points = torch.tensor([[0.300000005, 0.0], [0.5, 0.0]], dtype=torch.float64)
    queries = torch.zeros(1, 2, dtype=torch.float64)
    assert index_ops.radius_neighbors(points, queries, 0.3, 2).tolist() == [[0, -1]]
    opbridge.testing.check_op("index_ops::radius_neighbors", reference, [(points, queries, 0.3, 2)],
                              dtypes=[torch.float64], opcheck=False)


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"queries must have D = points.shape\[1\] = 3 coordinates, got 2"):
        index_ops.radius_neighbors(torch.randn(5, 3), torch.randn(2, 2), 0.5, 2)
    with pytest.raises(ValueError, match="radius must be finite and > 0"):
        index_ops.radius_neighbors(torch.randn(5, 3), torch.randn(2, 3), -1.0, 2)


def test_ort_without_torch_api():
    # The ORT side of the package: a library path and session options, no torch involved.
    import onnxruntime as ort

    assert index_ops.get_library_path().endswith("libindex_ops_ort.so")
    assert isinstance(index_ops.session_options(), ort.SessionOptions)
