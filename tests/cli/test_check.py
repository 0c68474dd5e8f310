"""``opbridge check MODEL.onnx``. Torch-free: runs in the ORT version matrix too."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import opbridge
from helpers.onnx_models import IR_VERSION, single_node_model
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
    assert "ai.opbridge::NoSuchOp" in out
    provided = next(line for line in out.splitlines() if "this opbridge provides" in line)
    assert all(op in provided for op in ("GroupNorm", "Inverse", "MultiScaleDeformableAttention"))
    assert "needs a newer opbridge" in out


def test_run_failure_is_reported(tmp_path, capsys):
    # Every op is provided, but the node is invalid. With C known the load refuses it (its static
    # shapes already fail the op's checks); with C symbolic the run fails with the kernel's message.
    path = _save(single_node_model("GroupNorm", opbridge.DOMAIN, [("X", np.float32, ["N", 4, 3])],
                                   attrs={"num_groups": 3}), tmp_path, "bad.onnx")
    code, out, _ = _run(capsys, path)
    assert code == 1
    assert "static shapes already fail" in out and "num_groups must divide" in out, out
    path = _save(single_node_model("GroupNorm", opbridge.DOMAIN, [("X", np.float32, ["N", "C", 3])],
                                   attrs={"num_groups": 3}), tmp_path, "bad_at_run.onnx")
    code, out, _ = _run(capsys, path, "--dim", "C=4")
    assert code == 1
    assert "FAILED: running the model failed" in out and "num_groups must divide" in out, out


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


# ---- op libraries of installed packages (entry points "opbridge.libraries") -------------------
# Packages whose entry point cannot give a library, each for another reason: what `opbridge
# check` must say about it (it names the package, skips it and checks the model all the same).
BAD_PACKAGES = {
    "fails_at_import": ("raise RuntimeError('fails_at_import is broken')\n", None,
                        "RuntimeError: fails_at_import is broken"),
    "exits_at_import": ("import sys\nsys.exit(3)\n", None, "it raised SystemExit(3)"),
    "no_such_function": ("", "no_such_function:library_spec", "AttributeError"),
    "no_such_module": ("", "no_such_module.nothing:library_spec", "ModuleNotFoundError"),
    "wrong_answer": ("def library_spec():\n    return ['not', 'a', 'dict']\n", None,
                     "it returned ['not', 'a', 'dict']; expected a dict"),
    "missing_library": ("def library_spec():\n    return {'ort': '/nonexistent/libmissing_ort.so'}\n", None,
                        "cannot load the custom-op library /nonexistent/libmissing_ort.so"),
    "not_an_opbridge_library": ("import ctypes.util\ndef library_spec():\n"
                                "    return {'ort': ctypes.util.find_library('c') or 'libc.so.6'}\n", None,
                                "is not an ORT custom-op library built on opbridge"),
    # Over the limit (OPBRIDGE_DISCOVER_TIMEOUT=1 below): an import that never returns.
    "hangs_at_import": ("import threading\nthreading.Event().wait()\n", None,
                        "importing it and calling it took over 1 s (the limit, OPBRIDGE_DISCOVER_TIMEOUT)"),
    # Under the limit: waited for (it is skipped for its answer, not for the time it took).
    "slow_under_limit": ("import time\ntime.sleep(0.3)\ndef library_spec():\n    return None\n", None,
                         "it returned None; expected a dict"),
}


def _bad_packages(tmp_path, names=tuple(BAD_PACKAGES)):
    from helpers.scaffold_helpers import fake_op_package

    site = tmp_path / "site"
    for name in names:
        code, entry_point, _ = BAD_PACKAGES[name]
        fake_op_package(site, name, code, entry_point)
    return site


def test_broken_and_slow_packages_are_skipped_by_name(tmp_path):
    site = _bad_packages(tmp_path)
    path = _save(single_node_model("GroupNorm", opbridge.DOMAIN, [("X", np.float32, [1, 4, 2])],
                                   attrs={"num_groups": 2}), tmp_path, "gn.onnx")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "OPBRIDGE_DISCOVER_TIMEOUT": "1"}
    # The timeout of the run only guards against a hang: the check itself waits 1 s for the
    # package that hangs.
    proc = subprocess.run([sys.executable, "-m", "opbridge", "check", path], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("OK")
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("skipped ")]
    for name, (_, _, says) in BAD_PACKAGES.items():
        lines = [line for line in skipped if f"package {name} (entry point opbridge.libraries: {name} = " in line]
        assert len(lines) == 1 and says in lines[0], (name, says, skipped)
    assert len(skipped) == len(BAD_PACKAGES), skipped
    # --no-discover: none of them is even imported.
    proc = subprocess.run([sys.executable, "-m", "opbridge", "check", "--no-discover", path], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "skipped" not in proc.stdout, proc.stdout + proc.stderr


def test_a_missing_op_points_at_the_skipped_packages(tmp_path, monkeypatch, capsys):
    # In this process: none that leaves a thread behind or takes time.
    site = _bad_packages(tmp_path, ["fails_at_import", "wrong_answer", "missing_library"])
    monkeypatch.syspath_prepend(str(site))
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Frobnicate", ["X"], ["Y"], domain="com.acme")], "acme", [x],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)],
                              ir_version=IR_VERSION)
    code, out, _ = _run(capsys, _save(model, tmp_path, "acme.onnx"))
    assert code == 1 and "MISSING" in out
    assert "Skipped above: the op libraries of " in out and "fails_at_import" in out and "wrong_answer" in out, out


@pytest.mark.parametrize("value", ["soon", "0", "-1", "inf", "nan"])
def test_bad_discover_timeout_is_a_clear_error(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv("OPBRIDGE_DISCOVER_TIMEOUT", value)
    path = _save(single_node_model("Relu", "", [("X", np.float32, [2])]), tmp_path, "relu.onnx")
    code, _, err = _run(capsys, path)
    assert code == 2
    assert f"OPBRIDGE_DISCOVER_TIMEOUT must be a number of seconds > 0, got {value!r}" in err, err
