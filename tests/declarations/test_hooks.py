"""Public hooks for what an output rule cannot describe: opbridge.ops.register_fake,
opbridge.onnx.register_shape_inference, register_translation and register_symbolic. Each test runs
in a child process (hooks change how the op is handled for the rest of that process) on the
in-tree Inverse, and shows the hook is what runs: a wrong hook makes check_op fail."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

PRELUDE = """
import numpy as np, onnx, torch
import opbridge, opbridge.onnx, opbridge.ops, opbridge.testing
calls = []
samples = [(torch.randn(3, 4, 4) + 4 * torch.eye(4),)]
def reference(x):
    return np.linalg.inv(np.asarray(x, dtype=np.float64))
"""


def run(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_register_fake_supplies_the_fake_kernel():
    out = run("""
        @opbridge.ops.register_fake("opbridge::inverse")
        def wrong(x, on_singular):
            calls.append(1)
            return x.new_empty(x.shape[:-1])
        r = opbridge.testing.check_op("opbridge::inverse", reference, samples, export=False, gradcheck=False,
                                      raise_on_failure=False)
        print("wrong", len(r.failures) > 0, bool(calls))
        opbridge.ops.register_fake("opbridge::inverse", lambda x, on_singular: calls.append(2) or torch.empty_like(x))
        r = opbridge.testing.check_op("opbridge::inverse", reference, samples, raise_on_failure=False)
        print("right", len(r.failures), 2 in calls)
        # The declaration's checks still run first: the same verdict as the kernels.
        from torch._subclasses.fake_tensor import FakeTensorMode
        try:
            with FakeTensorMode():
                torch.ops.opbridge.inverse.default(torch.empty(2, 3), "raise")
        except ValueError as e:
            print("checked", "square" in str(e))
    """)
    assert "wrong True True" in out and "right 0 True" in out and "checked True" in out, out


def test_register_shape_inference_supplies_the_onnx_inference():
    out = run("""
        @opbridge.onnx.register_shape_inference("opbridge::inverse")
        def infer(ctx):
            t = onnx.TypeProto()
            t.CopyFrom(ctx.get_input_type(0))
            t.tensor_type.shape.dim[0].dim_param = "from_hook"
            ctx.set_output_type(0, t)
        class M(torch.nn.Module):
            def forward(self, x):
                return opbridge.ops.inverse(x) * 2
        proto = opbridge.onnx.export(M(), samples[0], dynamo=False, dynamic_batch=False)
        del proto.graph.value_info[:]  # the exporter's own: inference gives them again
        inferred = onnx.shape_inference.infer_shapes(proto)
        print(sorted({d.dim_param for v in inferred.graph.value_info for d in v.type.tensor_type.shape.dim}))
    """)
    assert "from_hook" in out, out


def test_register_translation_and_symbolic_supply_the_exporters_rules():
    out = run("""
        import onnxscript
        op = onnxscript.values.Opset(opbridge.DOMAIN, 1)
        @opbridge.onnx.register_translation("opbridge::inverse")
        def translate(x, on_singular="raise"):
            calls.append("dynamo")
            return op.Inverse(x, on_singular=on_singular)
        @opbridge.onnx.register_symbolic("opbridge::inverse")
        def symbolic(g, x, on_singular):
            calls.append("torchscript")
            return g.op("ai.opbridge::Inverse", x)
        r = opbridge.testing.check_op("opbridge::inverse", reference, samples, raise_on_failure=False)
        print(len(r.failures), sorted(set(calls)))
        opbridge.onnx.register_symbolic("opbridge::inverse", lambda g, x, on_singular: g.op("Neg", x))
        r = opbridge.testing.check_op("opbridge::inverse", reference, samples, exporters=("torchscript",),
                                      raise_on_failure=False)
        print("wrong", len(r.failures) > 0)
    """)
    assert "0 ['dynamo', 'torchscript']" in out and "wrong True" in out, out
