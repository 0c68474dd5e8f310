"""The ai.opbridge OpSchemas: onnx.checker and onnx shape inference understand our nodes.

Torch-free (onnx, numpy): scripts/ort_matrix.sh runs it with the oldest onnx opbridge supports
(the `tools` extra's floor), the first that lets a Python OpSchema carry shape inference.
"""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

import opbridge.onnx
from helpers.onnx_models import IR_VERSION


def _model(x_shape, num_groups=2, scale_shape=None, bias_shape=None, attrs=None):
    """Relu -> GroupNorm -> Relu, shapes declared on the graph input only."""
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    gn_inputs = ["A", "", ""]
    if scale_shape is not None:
        inputs.append(helper.make_tensor_value_info("scale", TensorProto.FLOAT, scale_shape))
        gn_inputs[1] = "scale"
    if bias_shape is not None:
        inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, bias_shape))
        gn_inputs[2] = "bias"
    while gn_inputs[-1] == "":
        gn_inputs.pop()
    attrs = {"num_groups": num_groups, **(attrs or {})}
    if attrs["num_groups"] is None:
        del attrs["num_groups"]
    nodes = [
        helper.make_node("Relu", ["X"], ["A"]),
        helper.make_node("GroupNorm", gn_inputs, ["B"], domain=opbridge.onnx.DOMAIN, name="gn", **attrs),
        helper.make_node("Relu", ["B"], ["Y"]),
    ]
    out = helper.make_tensor_value_info("Y", TensorProto.FLOAT, x_shape)
    graph = helper.make_graph(nodes, "g", inputs, [out])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(opbridge.onnx.DOMAIN, opbridge.onnx.DOMAIN_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def _shape(model, name):
    for vi in (*model.graph.value_info, *model.graph.output):
        if vi.name == name:
            t = vi.type.tensor_type
            if not t.HasField("shape"):
                return t.elem_type, None
            return t.elem_type, [d.dim_param or d.dim_value for d in t.shape.dim]
    return None


def test_importing_opbridge_onnx_registers_the_schema():
    schema = onnx.defs.get_schema("GroupNorm", opbridge.onnx.DOMAIN_VERSION, opbridge.onnx.DOMAIN)
    assert [i.name for i in schema.inputs] == ["X", "scale", "bias"]
    assert schema.attributes["num_groups"].required
    assert schema.attributes["epsilon"].default_value.f == pytest.approx(1e-5)
    assert schema.has_type_and_shape_inference_function


@pytest.mark.parametrize("scale, bias", [([6], [6]), (None, None), (None, [6])])
def test_checker_full_check_accepts_valid_nodes(scale, bias):
    onnx.checker.check_model(_model(["N", 6, "H", 4], num_groups=3, scale_shape=scale, bias_shape=bias),
                             full_check=True)


def test_checker_rejects_missing_required_attribute():
    with pytest.raises(onnx.checker.ValidationError, match="num_groups"):
        onnx.checker.check_model(_model(["N", 6, 4], num_groups=None), full_check=True)


def test_infer_shapes_types_the_custom_output_and_downstream():
    model = _model(["N", 6, "H", 4], num_groups=3, scale_shape=[6], bias_shape=[6])
    inferred = opbridge.onnx.infer_shapes(model)
    assert _shape(inferred, "B") == (TensorProto.FLOAT, ["N", 6, "H", 4])
    # Relu after GroupNorm is typed from GroupNorm's output.
    assert _shape(inferred, "Y") == (TensorProto.FLOAT, ["N", 6, "H", 4])


def test_onnx_shape_inference_uses_the_schema_function():
    inferred = onnx.shape_inference.infer_shapes(_model([2, 6, 5], num_groups=2), strict_mode=True)
    assert _shape(inferred, "B") == (TensorProto.FLOAT, [2, 6, 5])


@pytest.mark.parametrize("kwargs, message", [
    ({"x_shape": ["N", 6, 4], "num_groups": 4}, "num_groups must divide the number of channels C = x.shape\\[1\\] = 6"),
    ({"x_shape": ["N", 6, 4], "num_groups": 0}, "num_groups must be > 0"),
    ({"x_shape": ["N"], "num_groups": 1}, "x must have rank >= 2"),
    ({"x_shape": ["N", 6, 4], "num_groups": 3, "scale_shape": [3]}, "weight must have C = 6 elements"),
    ({"x_shape": ["N", 6, 4], "num_groups": 3, "bias_shape": [7]}, "bias must have C = 6 elements"),
])
def test_shape_inference_rejects_invalid_nodes(kwargs, message):
    with pytest.raises(onnx.shape_inference.InferenceError, match=message):
        opbridge.onnx.infer_shapes(_model(**kwargs))


def test_unknown_channels_are_not_checked():
    inferred = opbridge.onnx.infer_shapes(_model(["N", "C", 4], num_groups=4))
    assert _shape(inferred, "B") == (TensorProto.FLOAT, ["N", "C", 4])


def test_an_onnx_older_than_the_floor_is_refused_at_import():
    # onnx 1.19-1.22 would crash the interpreter at exit once our schemas are registered.
    import subprocess
    import sys

    code = ("import onnx\nonnx.__version__ = '1.22.0'\n"
            "try:\n    import opbridge.onnx\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ('opbridge.onnx needs onnx>=1.23, but onnx 1.22.0 is installed: '
                                  'pip install -U "opbridge[tools]"')
