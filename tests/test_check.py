"""``opbridge check MODEL.onnx``. Torch-free: runs in the ORT version matrix too."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import opbridge
from onnx_models import IR_VERSION, single_node_model
from opbridge.cli import main


def _save(model: onnx.ModelProto, tmp_path, name: str) -> str:
    path = str(tmp_path / name)
    onnx.save(model, path)
    return path


def _run(capsys, *argv):
    code = main(["check", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_custom_op_model_passes(tmp_path, capsys):
    path = _save(single_node_model("GroupNorm", opbridge.DOMAIN, [("X", np.float32, ["batch", 4, 3])],
                                   attrs={"num_groups": 2}), tmp_path, "custom.onnx")
    code, out, _ = _run(capsys, path, "--dim", "batch=5")
    assert code == 0, out
    assert "ai.opbridge::GroupNorm" in out and "opbridge" in out
    assert "input  X: float32 [5, 4, 3]" in out  # the symbolic dim took the --dim value
    assert "output Y: float32 [5, 4, 3], all finite" in out
    assert out.rstrip().endswith("OK")


def test_stock_model_passes_and_names_stock_onnxruntime(tmp_path, capsys):
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])
    nodes = [helper.make_node("Relu", ["X"], ["R"]), helper.make_node("Softmax", ["R"], ["Y"], axis=1)]
    graph = helper.make_graph(nodes, "stock", [x], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    code, out, _ = _run(capsys, _save(model, tmp_path, "stock.onnx"))
    assert code == 0, out
    assert "ai.onnx::Relu" in out and "ai.onnx::Softmax" in out and "stock onnxruntime" in out
    assert "input  X: float32 [2, 3]" in out  # default size of a symbolic dim


def test_unknown_custom_domain_fails_with_a_clear_report(tmp_path, capsys):
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("Relu", ["X"], ["R"]), helper.make_node("Frobnicate", ["R"], ["Y"], domain="com.acme")]
    graph = helper.make_graph(nodes, "acme", [x], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 4])])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)
    code, out, _ = _run(capsys, _save(model, tmp_path, "acme.onnx"))
    assert code == 1
    assert "com.acme::Frobnicate" in out and "MISSING" in out
    assert "FAILED: no implementation here for com.acme::Frobnicate" in out
    assert "domain(s) com.acme" in out and "The model was not run" in out
    assert "ai.onnx::Relu" in out  # what is provided is listed too


def test_unknown_opbridge_op_fails(tmp_path, capsys):
    path = _save(single_node_model("NoSuchOp", opbridge.DOMAIN, [("X", np.float32, [2, 3])]), tmp_path, "nosuch.onnx")
    code, out, _ = _run(capsys, path)
    assert code == 1
    assert "ai.opbridge::NoSuchOp" in out and "this opbridge provides GroupNorm" in out
    assert "needs a newer opbridge" in out


def test_run_failure_is_reported(tmp_path, capsys):
    # Every op is provided, but the node is invalid: the run fails with the kernel's message.
    path = _save(single_node_model("GroupNorm", opbridge.DOMAIN, [("X", np.float32, ["N", 4, 3])],
                                   attrs={"num_groups": 3}), tmp_path, "bad.onnx")
    code, out, _ = _run(capsys, path)
    assert code == 1
    assert "FAILED: running the model failed" in out and "num_groups must divide" in out


def test_unreadable_file_and_bad_arguments(tmp_path, capsys):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not a model\xff" * 10)
    assert _run(capsys, str(junk))[0] == 2
    assert _run(capsys, str(tmp_path / "missing.onnx"))[0] == 2
    good = _save(single_node_model("Relu", "", [("X", np.float32, [2])]), tmp_path, "relu.onnx")
    code, _, err = _run(capsys, good, "--dim", "N")
    assert code == 2 and "NAME=SIZE" in err


def test_command_line_entry_point(tmp_path):
    path = _save(single_node_model("GroupNorm", opbridge.DOMAIN, [("X", np.float32, [1, 4, 2])],
                                   attrs={"num_groups": 4}), tmp_path, "cli.onnx")
    proc = subprocess.run([sys.executable, "-m", "opbridge", "check", path], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ai.opbridge::GroupNorm" in proc.stdout
