"""The conventions every ``opbridge`` command follows (docs/cli.md): --version, --json documents
that match their JSON Schemas (docs/schemas/), -v / -q through logging, arguments checked before
any work, a closed stdout ending the command quietly, the documented exit statuses.
Torch-free: runs wherever onnx and onnxruntime are installed."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import opbridge
from helpers.onnx_models import IR_VERSION, single_node_model
from opbridge import cli
from opbridge.onnx._group_norm_fusion import LABEL_DECOMPOSITION

jsonschema = pytest.importorskip("jsonschema")

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def _validate(doc: dict, command: str) -> None:
    schema = json.loads((SCHEMAS / f"{command}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)


def _main(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _json(capsys, *argv):
    code, out, err = _main(capsys, *argv, "--json")
    doc = json.loads(out)  # stdout holds the document and nothing else
    _validate(doc, argv[0])
    return code, doc, err


def _group_norm_model(tmp_path, name="gn.onnx", num_groups=2, dims=("batch", 4, 3)) -> str:
    path = str(tmp_path / name)
    onnx.save(single_node_model("GroupNorm", opbridge.DOMAIN, [("X", np.float32, list(dims))],
                                attrs={"num_groups": num_groups}), path)
    return path


def _missing_op_model(tmp_path) -> str:
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("Relu", ["X"], ["R"]), helper.make_node("Frobnicate", ["R"], ["Y"], domain="com.acme")]
    graph = helper.make_graph(nodes, "acme", [x], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 4])])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)]
    path = str(tmp_path / "acme.onnx")
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION), path)
    return path


def _run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "opbridge", *args], capture_output=True, text=True, timeout=600,
                          **kw)


# ---- --version, --help ---------------------------------------------------------------------


def test_version():
    r = _run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"opbridge {opbridge.__version__}", r.stdout + r.stderr


def test_help_is_plain_text_and_a_missing_command_names_every_command():
    r = _run("--help")
    assert r.returncode == 0 and "``" not in r.stdout and "-q" in r.stdout and "--version" in r.stdout
    r = _run()
    assert r.returncode == 2
    assert all(c in r.stderr for c in cli.COMMANDS), r.stderr


# ---- info --json ---------------------------------------------------------------------------


def test_info_json(capsys):
    code, doc, err = _json(capsys, "info")
    assert code == 0 and err == ""
    assert doc["opbridge"] == opbridge.__version__ and doc["library_path"] == opbridge.get_library_path()
    assert doc["onnxruntime"] == {"installed": True, "version": ort.__version__,
                                  "providers": ort.get_available_providers()}
    assert doc["onnx"]["domain"] == opbridge.DOMAIN
    assert {op["op_type"] for op in doc["onnx"]["ops"]} >= {"GroupNorm", "Inverse", "MultiScaleDeformableAttention"}
    assert doc["build"] == opbridge.build_info()


def test_info_text_is_what_json_says(capsys):
    code, text, _ = _main(capsys, "info")
    _, doc, _ = _json(capsys, "info")
    assert code == 0
    assert text.splitlines()[0] == f"opbridge {doc['opbridge']}"
    assert doc["library_path"] in text and ", ".join(doc["onnxruntime"]["providers"]) in text


# ---- check --json --------------------------------------------------------------------------


def test_check_json_of_a_model_that_runs(tmp_path, capsys):
    path = _group_norm_model(tmp_path)
    code, doc, _ = _json(capsys, "check", path, "--dim", "batch=5")
    assert code == 0 and doc["ok"] and doc["ran"] and doc["error"] is None and doc["missing"] == []
    assert doc["model"] == path and doc["ir_version"] == IR_VERSION
    assert doc["opsets"] == {o.domain or "ai.onnx": o.version for o in onnx.load(path).opset_import}
    assert doc["providers"] == ["CPUExecutionProvider"] and doc["onnxruntime"] == ort.__version__
    assert doc["ops"] == [{"name": "ai.opbridge::GroupNorm", "domain": "ai.opbridge", "op_type": "GroupNorm",
                           "count": 1, "provider": "opbridge", "note": None}]
    assert doc["inputs"] == [{"name": "X", "dtype": "float32", "shape": [5, 4, 3]}]
    assert doc["outputs"] == [{"name": "Y", "dtype": "float32", "shape": [5, 4, 3], "non_finite": 0}]


def test_check_json_of_a_model_that_fails(tmp_path, capsys):
    code, doc, _ = _json(capsys, "check", _missing_op_model(tmp_path))
    assert code == 1 and not doc["ok"] and not doc["ran"]
    assert doc["missing"] == ["com.acme::Frobnicate"] and "com.acme::Frobnicate" in doc["error"]
    by_name = {o["name"]: o for o in doc["ops"]}
    assert by_name["ai.onnx::Relu"]["provider"] == "stock onnxruntime"
    assert by_name["com.acme::Frobnicate"]["provider"] is None and by_name["com.acme::Frobnicate"]["note"]
    assert doc["inputs"] == [] and doc["outputs"] == []
    # Loads but fails at run: num_groups=3 does not divide C=4 (C symbolic, so the load accepts it).
    path = _group_norm_model(tmp_path, "bad.onnx", num_groups=3, dims=("N", "C", 3))
    code, doc, _ = _json(capsys, "check", path, "--dim", "C=4")
    assert code == 1 and not doc["ok"] and not doc["ran"] and "num_groups must divide" in doc["error"]


def test_check_json_counts_non_finite_outputs(tmp_path, capsys):
    # Log of the random inputs: NaN wherever an input is negative, so some and not all elements.
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [64])
    graph = helper.make_graph([helper.make_node("Log", ["X"], ["Y"])], "log", [x],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [64])])
    path = str(tmp_path / "log.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION), path)
    code, doc, _ = _json(capsys, "check", path)
    assert code == 0
    assert 0 < doc["outputs"][0]["non_finite"] < 64


# ---- optimize --json -----------------------------------------------------------------------


def _decomposition_model(tmp_path) -> str:
    """X -> Reshape [0, G, -1] -> InstanceNormalization -> Reshape(Shape(X)) -> Mul -> Add, the
    TorchScript exporter's GroupNorm (C=8, G=4)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array([0, 4, -1], np.int64), "grouped"),
             numpy_helper.from_array(np.ones(4, np.float32), "ones"),
             numpy_helper.from_array(np.zeros(4, np.float32), "zeros"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, (8, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.uniform(-0.5, 0.5, (8, 1, 1)).astype(np.float32), "b")]
    nodes = [helper.make_node("Reshape", ["X", "grouped"], ["r"]),
             helper.make_node("InstanceNormalization", ["r", "ones", "zeros"], ["n"], epsilon=1e-5),
             helper.make_node("Shape", ["X"], ["s"]),
             helper.make_node("Reshape", ["n", "s"], ["u"]),
             helper.make_node("Mul", ["u", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["Y"])]
    graph = helper.make_graph(nodes, "gn", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 8, 5, 6])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 8, 5, 6])], inits)
    path = str(tmp_path / "decomposition.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION), path)
    return path


def test_optimize_json(tmp_path, capsys):
    src, dst = _decomposition_model(tmp_path), str(tmp_path / "out.onnx")
    code, doc, _ = _json(capsys, "optimize", src, dst, "--dim", "N=3", "--runs", "3")
    assert code == 0 and doc["ok"] and doc["error"] is None
    assert doc["rewritten"] == {LABEL_DECOMPOSITION: 1} and doc["checked_runs"] == 3
    assert doc["written"] == [dst] and os.path.isfile(dst)
    assert [n.op_type for n in onnx.load(dst).graph.node] == ["GroupNorm"]
    # Nothing to rewrite: written unchanged, nothing checked.
    code, doc, _ = _json(capsys, "optimize", dst, str(tmp_path / "again.onnx"))
    assert code == 0 and doc["rewritten"] == {} and doc["checked_runs"] == 0


# ---- pt2 --json ----------------------------------------------------------------------------


def test_pt2_json(tmp_path, capsys):
    """A package that calls an op of no known library (the test of a package opbridge's ops can
    run, which needs an AOTInductor build, is tests/deploy/test_aoti.py's)."""
    import zipfile

    pkg = tmp_path / "other.pt2"
    node = {"name": "buf0", "node": {"target": "nosuchns::frob", "inputs": [], "outputs": []}}
    with zipfile.ZipFile(pkg, "w") as z:
        z.writestr("other/data/aotinductor/model/x.wrapper.json", json.dumps({"nodes": [node]}))
        z.writestr("other/data/aotinductor/model/x.wrapper_metadata.json", "{}")
    code, doc, _ = _json(capsys, "pt2", str(pkg), "--no-load")
    assert code == 1 and not doc["ok"] and doc["ops"] == ["nosuchns::frob"]
    assert doc["libraries"] == {"nosuchns": None} and doc["loads"] is None and doc["problems"]
    code, out, err = _main(capsys, "pt2", str(tmp_path / "gn.onnx"), "--json")
    assert code == 2 and out == "" and "gn.onnx" in err


# ---- arguments checked before any work -----------------------------------------------------


@pytest.mark.parametrize("command", ["check", "optimize"])
def test_unknown_dim_name_is_refused(tmp_path, capsys, command):
    src = _decomposition_model(tmp_path)
    args = [src] if command == "check" else [src, str(tmp_path / "o.onnx")]
    code, out, err = _main(capsys, command, *args, "--dim", "n=3")
    assert code == 2 and out == ""
    assert "--dim n=...: the model's inputs have no dimension named 'n' (their named dimensions: N)" in err, err
    assert not (tmp_path / "o.onnx").exists()
    code, _, err = _main(capsys, "check", _group_norm_model(tmp_path, "static.onnx", dims=(2, 4, 3)), "--dim", "N=2")
    assert code == 2 and "none: every input dimension is fixed" in err


@pytest.mark.parametrize("command", ["check", "optimize"])
def test_unknown_provider_is_refused(tmp_path, capsys, command):
    src = _decomposition_model(tmp_path)
    args = [src] if command == "check" else [src, str(tmp_path / "o.onnx")]
    code, out, err = _main(capsys, command, *args, "--provider", "BogusExecutionProvider", "--json")
    assert code == 2 and out == ""
    assert "--provider expects an execution provider of onnxruntime, got 'BogusExecutionProvider'" in err
    assert ", ".join(ort.get_available_providers()) in err


def test_provider_this_onnxruntime_lacks_is_named(tmp_path, capsys):
    lacking = [p for p in ort.get_all_providers() if p not in ort.get_available_providers()]
    if "CUDAExecutionProvider" in lacking:
        lacking.insert(0, "CUDAExecutionProvider")
    if not lacking:
        pytest.skip("this onnxruntime has every provider it knows")
    code, _, err = _main(capsys, "check", _group_norm_model(tmp_path), "--provider", lacking[0])
    assert code == 2 and f"--provider {lacking[0]}: this onnxruntime {ort.__version__} is built without it" in err
    if lacking[0] == "CUDAExecutionProvider":
        assert "onnxruntime-gpu" in err


# ---- -v / -q -------------------------------------------------------------------------------


def test_quiet_prints_no_report_but_the_reason_of_a_failure(tmp_path, capsys):
    code, out, err = _main(capsys, "check", _group_norm_model(tmp_path), "-q")
    assert code == 0 and out == "" and err == ""
    code, out, err = _main(capsys, "-q", "check", _missing_op_model(tmp_path))
    assert code == 1 and out == ""
    assert err.startswith("opbridge check: ") and "no implementation here for com.acme::Frobnicate" in err


def test_verbose_logs_stage_times(tmp_path, capsys):
    code, out, err = _main(capsys, "check", _group_norm_model(tmp_path), "-v")
    assert code == 0 and out.rstrip().endswith("OK")
    for stage in ("read the model's header", "ops and who provides them", "onnxruntime session", "run", "check"):
        assert f"opbridge check: {stage}: " in err and " s\n" in err, (stage, err)
    src = _decomposition_model(tmp_path)
    code, _, err = _main(capsys, "-v", "optimize", src, str(tmp_path / "o.onnx"))
    assert code == 0
    for stage in ("rewrite", "write", "check against the original"):
        assert f"opbridge optimize: {stage}: " in err, (stage, err)


def test_logging_is_left_as_it_was(tmp_path, capsys):
    logger = logging.getLogger("opbridge")
    before = (list(logger.handlers), logger.level, logger.propagate)
    _main(capsys, "-v", "check", _group_norm_model(tmp_path))
    assert (list(logger.handlers), logger.level, logger.propagate) == before


# ---- closed stdout, exit statuses ----------------------------------------------------------


@pytest.mark.parametrize("argv", [["info"], ["info", "--json"], ["--cmake-dir"]])
def test_closed_stdout_ends_quietly(argv):
    # The reading end is closed before the command starts: every write to stdout fails, so
    # the outcome does not depend on timing (as `opbridge info | head -1` does).
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([sys.executable, "-m", "opbridge", *argv], stdout=write, stderr=subprocess.PIPE,
                           text=True, timeout=600)
    finally:
        os.close(write)
    assert r.returncode == cli.EXIT_BROKEN_PIPE and r.stderr == "", r.stderr


def test_unreadable_model_is_status_2_and_names_the_file(tmp_path, capsys):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not a model\xff" * 10)
    for argv in (["check", str(junk)], ["optimize", str(junk), str(tmp_path / "o.onnx")]):
        code, out, err = _main(capsys, *argv, "--json")
        assert code == 2 and out == "" and str(junk) in err, (argv, err)


# ---- the model's header, read without its tensors ------------------------------------------


def test_header_is_what_onnx_reads(tmp_path):
    big = numpy_helper.from_array(np.arange(1 << 18, dtype=np.float32), "big")
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 3, None])
    k = helper.make_tensor_value_info("K", TensorProto.INT64, [7])
    graph = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "g", [x, k],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 3, None])], [big])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.x", 3)],
                              ir_version=IR_VERSION)
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    header = cli.read_header(path)
    assert header.ir_version == IR_VERSION and header.opsets == {"ai.onnx": 17, "com.x": 3}
    assert header.inputs == [("X", ["batch", 3, None]), ("K", [7])] and header.dim_names() == ["batch"]
    onnx.save(model, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.data")
    assert cli.read_header(str(tmp_path / "ext.onnx")) == header
    data = Path(path).read_bytes()
    for bad in (data[: len(data) // 2], b"\x00not a model\xff" * 10, b""):
        (tmp_path / "bad.onnx").write_bytes(bad)
        with pytest.raises(ValueError):
            cli.read_header(str(tmp_path / "bad.onnx"))
