"""Tests of shapes::segment_sum: against a float64 reference written here, independently of the kernel,
plus everything opbridge.testing.check_op runs (torch.library.opcheck, gradcheck, gradgradcheck,
export with both exporters, ONNX Runtime against torch)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import opbridge.onnx
import opbridge.testing
import shapes
import shapes.ops  # noqa: F401  (the torch side: extension, fake kernels, autograd)


def reference(values, segment_ids, num_segments):
    """float64 numpy: a loop over the rows."""
    values = np.asarray(values, dtype=np.float64)
    y = np.zeros((num_segments, values.shape[1]))
    for i, s in enumerate(np.asarray(segment_ids)):
        y[s] += values[i]
    return y


def samples():
    """Fresh random inputs every run (never all zeros): empty segments, one row, more segments than rows."""
    return [
        (torch.randn(7, 3), torch.randint(0, 4, (7,)), 4),
        (torch.randn(1, 5), torch.tensor([2]), 3),
        (torch.randn(3, 2), torch.tensor([0, 0, 5]), 9),
    ]


def test_check_op():
    opbridge.testing.check_op("shapes::segment_sum", reference, samples())


def test_output_size_is_the_attribute():
    values, ids = torch.randn(5, 4, dtype=torch.float64), torch.tensor([1, 0, 1, 3, 3])
    y = shapes.segment_sum(values, ids, 6)
    assert y.shape == (6, 4)
    np.testing.assert_allclose(y.numpy(), reference(values.numpy(), ids.numpy(), 6), rtol=1e-12)
    # The fake kernel (torch.export) and ONNX shape inference get the size from the attribute too.
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fake = torch.ops.shapes.segment_sum.default(torch.empty(5, 4), torch.empty(5, dtype=torch.int64), 6)
    assert fake.shape == (6, 4)


def test_onnx_shape_inference_reads_the_attribute(tmp_path):
    class M(torch.nn.Module):
        def forward(self, values, ids):
            return shapes.segment_sum(values, ids, 6)

    proto = opbridge.onnx.export(M(), (torch.randn(5, 4), torch.tensor([1, 0, 1, 3, 3])), dynamo=False)
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    (out,) = inferred.graph.output
    assert [d.dim_value if d.HasField("dim_value") else d.dim_param for d in out.type.tensor_type.shape.dim] == [6, 4]


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"segment_ids must have one id per row of values \(3\), got 2"):
        shapes.segment_sum(torch.randn(3, 2), torch.tensor([0, 1]), 2)
    with pytest.raises(ValueError, match=r"segment_ids\[1\] = 4 is outside \[0, num_segments = 2\)"):
        shapes.segment_sum(torch.randn(2, 2), torch.tensor([0, 4]), 2)
    # A negative size from the output rule, in the kernel and in the fake kernel alike.
    with pytest.raises(ValueError, match=r"output y: shape rule 'num_segments, values\[1\]' gives -1"):
        shapes.segment_sum(torch.randn(0, 2), torch.tensor([], dtype=torch.int64), -1)
    with pytest.raises(ValueError, match=r"gives -1"), torch._subclasses.fake_tensor.FakeTensorMode():
        torch.ops.shapes.segment_sum.default(torch.empty(2, 2), torch.empty(2, dtype=torch.int64), -1)


def test_ort_without_torch_api():
    # The ORT side of the package: a library path and session options, no torch involved.
    import onnxruntime as ort

    assert shapes.get_library_path().endswith("libshapes_ort.so")
    assert isinstance(shapes.session_options(), ort.SessionOptions)


def test_ort_checks_the_ids_values_too():
    # segment_ids is host_memory(): the declaration reads its values, in ORT as in torch.
    class M(torch.nn.Module):
        def forward(self, values, ids):
            return shapes.segment_sum(values, ids, 3)

    proto = opbridge.onnx.export(M().eval(), (torch.randn(4, 2), torch.tensor([0, 1, 2, 1])))
    sess = opbridge.InferenceSession(proto)
    feeds = {"values": np.random.default_rng().standard_normal((2, 2)).astype(np.float32), "ids": np.array([2, 3])}
    with pytest.raises(Exception, match=r"segment_ids\[1\] = 3 is outside \[0, num_segments = 3\)"):
        sess.run(None, feeds)
