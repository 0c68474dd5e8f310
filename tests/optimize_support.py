"""Helpers of the optimize / fusion / external-data tests (torch-free): an independent float64
evaluator for rewritten models and a probe for the ORT library's GroupNorm activation."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import opbridge
from onnx_models import IR_VERSION
from reference import group_norm as ref_group_norm


def silu(y: np.ndarray) -> np.ndarray:
    return y / (1.0 + np.exp(-y))


def group_norm_act_ref(x, num_groups, weight=None, bias=None, eps=1e-5, activation="none"):
    """GroupNorm (tests/reference.py) then the activation, in float64."""
    y = ref_group_norm(x, num_groups, weight, bias, eps)
    if activation == "silu":
        y = silu(y)
    elif activation != "none":
        raise ValueError(f"unknown activation {activation!r}")
    return y


def _opbridge_group_norm_op():
    from onnx.reference.op_run import OpRun

    class GroupNorm(OpRun):
        op_domain = opbridge.DOMAIN
        op_schema = None  # evaluate what the node says; onnx's name-only schema lookup is not needed

        def _run(self, X, scale=None, bias=None, num_groups=None, epsilon=None, activation=None):
            if isinstance(activation, bytes):
                activation = activation.decode()
            y = group_norm_act_ref(X, int(num_groups), scale, bias, 1e-5 if epsilon is None else float(epsilon),
                                   activation or "none")
            return (y.astype(X.dtype),)

    return GroupNorm


def reference_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """Runs a model with onnx's reference evaluator, ai.opbridge::GroupNorm (with its activation)
    from the float64 reference: checks a rewritten graph independently of opbridge's kernels."""
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(v) for v in ReferenceEvaluator(model, new_ops=[_opbridge_group_norm_op()]).run(None, feeds)]


@functools.lru_cache(maxsize=None)
def ort_applies_silu() -> bool:
    """Whether opbridge's ORT library applies GroupNorm's activation="silu" (ai.opbridge version 2)."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4, 3])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 4, 3])
    node = helper.make_node("GroupNorm", ["X"], ["Y"], domain=opbridge.DOMAIN, num_groups=2, activation="silu")
    model = helper.make_model(helper.make_graph([node], "probe", [x], [y]), ir_version=IR_VERSION,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(opbridge.DOMAIN, 2)])
    data = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    try:
        got = opbridge.InferenceSession(model).run(None, {"X": data})[0]
    except Exception:
        return False
    return bool(np.allclose(got, group_norm_act_ref(data, 2, activation="silu"), atol=1e-4))


needs_ort_silu = pytest.mark.skipif(
    "not __import__('optimize_support').ort_applies_silu()",
    reason="opbridge's ORT library does not apply GroupNorm's activation attribute yet "
    "(ai.opbridge GroupNorm version 2); the fused graph is checked against the float64 reference instead",
)
