"""Model files someone else made: `opbridge check`, `opbridge optimize`, opbridge.InferenceSession
and the reader under them (opbridge/onnx/_reader.py) refuse, before anything reads a tensor, external
data outside the model's folder (by `..`, an absolute path or a symbolic link), offsets and lengths
that are not non-negative integers or lie past the file's end, and tensors whose data does not match
their type and dims; each refusal names the model file, the tensor and the reason, with exit status 2
for the commands; a canary file beside the model's folder is never opened (inotify). A valid link
inside the folder is followed.

Then the fuzzer of model files (tests/fuzz/model_files.py): its judge catches what it must (a
traceback, a crash, a hang, a write outside out/, the canary opened), a short run in the default
suite (seed printed; OPBRIDGE_TEST_SEED replays it), a long one with --run-slow."""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opbridge
import opbridge.cli
from fuzz import model_files as fuzz
from helpers.onnx_models import IR_VERSION
from opbridge.onnx import _reader

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model(rng):
    """y = x + w (w: 64 float32 from an external data file `w.bin`), and the input, and w."""
    w = rng.standard_normal(64).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])],
        initializer=[numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION), w


def _write(folder, rng, entries=None, data=None, prepare=None):
    """The model in ``folder``/in, with w in external data described by ``entries`` (defaults: a
    valid entry into w.bin), a canary beside ``in``; returns (model path, canary path)."""
    folder.mkdir(exist_ok=True)
    (folder / "in").mkdir()
    canary = folder / "canary.bin"
    canary.write_bytes(b"secret " * 64)
    model, w = _model(rng)
    raw = w.tobytes() if data is None else data
    (folder / "in" / "w.bin").write_bytes(raw)
    t = model.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for key, value in ({"location": "w.bin", "offset": "0", "length": str(len(raw))} | (entries or {})).items():
        if value is None:
            continue
        e = t.external_data.add()
        e.key, e.value = key, value
    if prepare is not None:
        prepare(folder)
    path = folder / "in" / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path, canary


def _symlink(target):
    return lambda folder: os.symlink(target, folder / "in" / "link.bin")


# (entries, prepare, what the message says)
BAD = {
    "parent": ({"location": "../canary.bin"}, None, "is outside the model's folder"),
    "absolute": ({"location": "ABSOLUTE_CANARY"}, None, "is not a relative path"),
    "symlink_out": ({"location": "link.bin", "length": None}, _symlink("../canary.bin"),
                    "is outside the model's folder"),
    "symlink_to_folder_above": ({"location": "up/canary.bin", "length": None},
                                lambda f: os.symlink("..", f / "in" / "up"), "is outside the model's folder"),
    "dot_dot_inside": ({"location": "sub/../../canary.bin"}, None, "is outside the model's folder"),
    "folder_itself": ({"location": "."}, None, "is outside the model's folder"),
    "offset_text": ({"offset": "abc"}, None, "offset 'abc' is not a non-negative decimal integer"),
    "offset_negative": ({"offset": "-1"}, None, "offset '-1' is not a non-negative decimal integer"),
    "offset_spaces": ({"offset": " 0"}, None, "offset ' 0' is not a non-negative decimal integer"),
    "length_float": ({"length": "1e3"}, None, "length '1e3' is not a non-negative decimal integer"),
    "offset_past_end": ({"offset": "4096"}, None, "is past the end of"),
    "length_past_end": ({"length": "4096"}, None, "is truncated"),
    "length_short": ({"length": "252"}, None, "holds 252 bytes; its type FLOAT and dims [64] need 256"),
    "missing_file": ({"location": "nowhere.bin"}, None, "does not exist"),
    "directory": ({"location": "sub"}, lambda f: (f / "in" / "sub").mkdir(), "is not a regular file"),
    "fifo": ({"location": "pipe.bin", "length": None}, lambda f: os.mkfifo(f / "in" / "pipe.bin"),
             "is not a regular file"),
    "nul": ({"location": "w.bin\x00../canary.bin"}, None, "is not a relative path"),
    "no_location": ({"location": None}, None, "without a location"),
    # ONNX Runtime reads the offset of this location as a memory address; a folder of that name
    # beside the model would pass every other check.
    "ort_memory_marker": ({"location": "*/_ORT_MEM_ADDR_/*", "offset": "16"},
                          lambda f: ((f / "in" / "*" / "_ORT_MEM_ADDR_").mkdir(parents=True),
                                     (f / "in" / "*" / "_ORT_MEM_ADDR_" / "*").write_bytes(bytes(4096))),
                          "is ONNX Runtime's marker for data in memory"),
}


def _entries(form, folder):
    entries, prepare, reason = BAD[form]
    entries = {k: (str(folder / "canary.bin") if v == "ABSOLUTE_CANARY" else v) for k, v in entries.items()}
    return entries, prepare, reason


@pytest.mark.parametrize("form", sorted(BAD))
def test_bad_external_data_is_refused_by_every_reader(tmp_path, rng, capsys, form):
    entries, prepare, reason = _entries(form, tmp_path)
    path, canary = _write(tmp_path, rng, entries, prepare=prepare)
    watch = fuzz.Canary(canary)

    code = opbridge.cli.main(["check", str(path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(path) in err and "tensor 'w'" in err and reason in err, err

    code = opbridge.cli.main(["optimize", str(path), str(tmp_path / "out" / "o.onnx")])
    err = capsys.readouterr().err
    assert code == 2 and str(path) in err and "tensor 'w'" in err and reason in err, err
    assert not (tmp_path / "out").exists()

    with pytest.raises(_reader.UnreadableModel, match=reason.replace("[", r"\[").replace("(", r"\(")):
        opbridge.InferenceSession(str(path))
    with pytest.raises(_reader.UnreadableModel):
        _reader.load(str(path))
    with pytest.raises(_reader.UnreadableModel, match="tensor 'w'"):
        opbridge.onnx.check_attributes(str(path))
    assert watch.touched() in (False, None), "the canary beside the model's folder was opened"
    watch.close()


def test_tensors_in_function_attribute_defaults_are_checked(tmp_path, rng, capsys):
    """A model-local function whose attribute default is a tensor in external data outside the
    folder: the reader walks function defaults too."""
    path, canary = _write(tmp_path, rng)
    model = onnx.load(str(path), load_external_data=False)
    default = helper.make_attribute("table", numpy_helper.from_array(np.ones(64, np.float32), "table"))
    default.t.ClearField("raw_data")
    default.t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../canary.bin"), ("offset", "0"), ("length", "256")):
        e = default.t.external_data.add()
        e.key, e.value = key, value
    fn = helper.make_function("local", "f", ["a"], ["b"], [helper.make_node("Identity", ["a"], ["b"])],
                              [helper.make_opsetid("", 17)], attributes=[])
    fn.attribute_proto.append(default)
    model.functions.append(fn)
    model.opset_import.append(helper.make_opsetid("local", 1))
    path.write_bytes(model.SerializeToString())
    watch = fuzz.Canary(canary)
    for argv in (["check", str(path)], ["optimize", str(path), str(tmp_path / "o.onnx")]):
        assert opbridge.cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "tensor 'table': its external data location '../canary.bin' is outside the model's folder" in err, err
    assert watch.touched() in (False, None)
    watch.close()


def test_a_link_inside_the_folder_is_followed(tmp_path, rng, capsys):
    def link(folder):
        (folder / "in" / "data").mkdir()
        os.replace(folder / "in" / "w.bin", folder / "in" / "data" / "w.bin")
        os.symlink("data/w.bin", folder / "in" / "link.bin")

    path, _ = _write(tmp_path, rng, {"location": "link.bin"}, prepare=link)
    assert opbridge.cli.main(["check", str(path)]) == 0, capsys.readouterr()
    # onnx.load itself refuses every link; opbridge's reader follows one that stays in the folder.
    w = numpy_helper.to_array(_reader.load_with_data(str(path)).graph.initializer[0])
    np.testing.assert_array_equal(w, np.frombuffer((tmp_path / "in" / "data" / "w.bin").read_bytes(), np.float32))
    x = rng.standard_normal(64).astype(np.float32)
    y = opbridge.InferenceSession(str(path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, x.astype(np.float64) + w.astype(np.float64), rtol=1e-6)


def test_overlapping_external_data_is_read_as_it_says(tmp_path, rng):
    """Two tensors on the same bytes: nothing forbids it; each reads what its entry says."""
    model, w = _model(rng)
    v = numpy_helper.from_array(w[::-1].copy(), "v")
    model.graph.initializer.append(v)
    model.graph.node.append(helper.make_node("Sub", ["y", "v"], ["z"]))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [64]))
    (tmp_path / "w.bin").write_bytes(w.tobytes())
    for t in model.graph.initializer:
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", "w.bin"), ("offset", "0"), ("length", "256")):
            e = t.external_data.add()
            e.key, e.value = key, value
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    x = rng.standard_normal(64).astype(np.float32)
    y, z = opbridge.InferenceSession(str(path)).run(None, {"x": x})
    np.testing.assert_allclose(z, x.astype(np.float64), atol=1e-6)  # x + w - w


@pytest.mark.parametrize("change, reason", [
    (lambda t: setattr(t, "raw_data", t.raw_data[:-4]), "holds 252 bytes of data; its type FLOAT and dims [64] need 256"),
    (lambda t: t.dims.__setitem__(0, -64), "has a negative dim -64"),
    (lambda t: t.dims.__setitem__(0, 2**40), "its type FLOAT and dims [1099511627776] need 4398046511104"),
    (lambda t: setattr(t, "data_type", 99), "has element type 99, which is not an ONNX tensor type"),
    (lambda t: (t.ClearField("raw_data"), t.float_data.extend([1.0] * 3)), "holds 3 values in float_data"),
], ids=["short_raw_data", "negative_dim", "huge_dim", "unknown_type", "few_values"])
def test_inline_tensors_that_lie_about_their_size_are_refused(tmp_path, rng, capsys, change, reason):
    model, _ = _model(rng)
    change(model.graph.initializer[0])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    for argv in (["check", str(path)], ["optimize", str(path), str(tmp_path / "o.onnx")]):
        code = opbridge.cli.main(argv)
        err = capsys.readouterr().err
        assert code == 2 and str(path) in err and "tensor 'w'" in err and reason in err, err
    assert not (tmp_path / "o.onnx").exists()


def _constant_model(value_attribute, second_producer=False):
    nodes = [helper.make_node("Constant", [], ["c"], **value_attribute), helper.make_node("Add", ["x", "c"], ["y"])]
    if second_producer:
        nodes.append(helper.make_node("Neg", ["x"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


@pytest.mark.parametrize("model, reason", [
    # The Constant's value is an INT (its schema says TENSOR): onnxscript's rewriter fails on it.
    (_constant_model({"value": 3}), "its graph is malformed (AttributeError"),
    # y defined twice: onnx_ir refuses to read the graph.
    (_constant_model({"value": numpy_helper.from_array(np.ones(2, np.float32))}, second_producer=True),
     "its graph is malformed (Error calling _deserialize_graph"),
], ids=["constant_not_a_tensor", "value_defined_twice"])
def test_a_malformed_graph_gets_checks_verdict_from_optimize(tmp_path, capsys, model, reason):
    """A graph that is read but malformed: ONNX Runtime cannot load it (check's exit status 1), and
    optimize fails on it the same way, naming the file and why, writing nothing."""
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert opbridge.cli.main(["check", str(path)]) == 1
    assert "could not load the model" in capsys.readouterr().out
    code = opbridge.cli.main(["optimize", str(path), str(tmp_path / "o.onnx")])
    out, err = capsys.readouterr()
    assert code == 1 and f"FAILED: cannot rewrite {path}: {reason}" in out, out + err
    assert "Traceback" not in out + err and not (tmp_path / "o.onnx").exists()


# ---------------------------------------------------------------------------------------------
# The fuzzer of model files
# ---------------------------------------------------------------------------------------------


def _judged(tmp_path, target):
    case = tmp_path / "case"
    (case / "in").mkdir(parents=True)
    (case / "tmp").mkdir()
    (case / fuzz.CANARY).write_bytes(b"canary")
    return fuzz.run_case(case, ["selftest"], timeout_s=5, target=target)


def _raise():
    raise RuntimeError("boom")


def _write_outside():
    with open("in/new.bin", "w") as f:
        f.write("x")
    return 0


def _open_canary():
    with open(fuzz.CANARY, "rb") as f:
        f.read()
    return 2


@pytest.mark.parametrize("target, finding", [
    (_raise, "Python traceback"),
    (lambda: os.abort(), "crash: SIGABRT"),
    (lambda: __import__("time").sleep(60), "hang"),
    (lambda: 3, "exit status 3"),
    (_write_outside, "files written outside out/"),
    (_open_canary, "the canary beside the input's folder was opened"),
], ids=["traceback", "crash", "hang", "exit_status", "write_outside", "canary"])
def test_the_fuzzers_judge_finds_what_it_must(tmp_path, target, finding):
    result = _judged(tmp_path, target)
    if finding.startswith("the canary") and not result["canary_watched"]:
        pytest.skip("no inotify here")
    assert any(f.startswith(finding) for f in result["findings"]), result


def _verdict(code, message):
    return {"exit": code, "message": message}


@pytest.mark.parametrize("check, optimize, differ", [
    (_verdict(2, "opbridge check: m.onnx: tensor 'w': bad"), _verdict(2, "opbridge optimize: m.onnx: tensor 'w': bad"),
     False),
    (_verdict(2, "opbridge check: m.onnx: tensor 'w': bad"), _verdict(1, "FAILED: x"), True),
    (_verdict(2, "opbridge check: m.onnx: tensor 'w': bad"), _verdict(2, "opbridge optimize: m.onnx: other"), True),
    (_verdict(1, "FAILED: x"), _verdict(2, "opbridge optimize: m.onnx: tensor 'w': bad"), True),
    (_verdict(0, ""), _verdict(2, "opbridge optimize: m.onnx: a model of 9 GB of tensors needs about 30 GB of memory "
                                  "to optimize and check"), False),
    (_verdict(1, "FAILED: x"), _verdict(1, "FAILED: cannot rewrite m.onnx: its graph is malformed (x)"), False),
    (_verdict(0, ""), _verdict(1, "FAILED: cannot rewrite m.onnx: its graph is malformed (x)"), True),
    (_verdict(1, "FAILED: x"), _verdict(0, "wrote out/model.onnx"), False),
    # A long reason (a graph nested 20 deep) recorded to MESSAGE_CHARS: optimize's longer name cuts it sooner.
    (_verdict(2, ("opbridge check: m.onnx: " + "g.node[0]." * 40)[:fuzz.MESSAGE_CHARS]),
     _verdict(2, ("opbridge optimize: m.onnx: " + "g.node[0]." * 40)[:fuzz.MESSAGE_CHARS]), False),
    (_verdict(2, ("opbridge check: m.onnx: " + "g.node[0]." * 40)[:fuzz.MESSAGE_CHARS]),
     _verdict(2, ("opbridge optimize: m.onnx: " + "g.node[1]." * 40)[:fuzz.MESSAGE_CHARS]), True),
], ids=["same_refusal", "refused_by_check_only", "other_message", "refused_by_optimize_only", "memory",
        "both_fail", "malformed_for_optimize_only", "unchanged_model_written", "same_long_refusal_cut",
        "other_long_refusal_cut"])
def test_the_fuzzers_judge_compares_the_two_verdicts(check, optimize, differ):
    assert bool(fuzz.verdict_disagreement(check, optimize)) == differ


def test_the_fuzzers_judge_passes_a_clean_refusal(tmp_path):
    def refuse():
        print("opbridge check: cannot read in/model.onnx: no such file", file=sys.stderr)
        return 2

    result = _judged(tmp_path, refuse)
    assert result["findings"] == [] and result["exit"] == 2 and result["message"].startswith("opbridge check:")


def _fuzz(tmp_path, cases):
    seed = int(os.environ.get("OPBRIDGE_TEST_SEED", secrets.randbits(32)))
    print(f"model-file fuzz seed: {seed} (replay with OPBRIDGE_TEST_SEED={seed})")
    record = tmp_path / "cases.jsonl"
    r = subprocess.run([sys.executable, "-m", "fuzz.model_files", "--cases", str(cases), "--seed", str(seed),
                        "--record", str(record)], cwd=TESTS, capture_output=True, text=True, timeout=3600)
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    print(r.stderr[-2000:])
    assert r.returncode == 0 and summary["findings"] == 0, r.stderr[-8000:]
    results = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(results) == cases
    for command in fuzz.COMMANDS:
        verdicts = {res[command]["exit"] for res in results}
        # The mutations reach every verdict: models that run, that fail, that are refused.
        assert {0, 1, 2} <= verdicts, (command, verdicts)
        refused = [res[command]["message"] for res in results if res[command]["exit"] == 2]
        assert any("tensor" in m for m in refused) and any("not an ONNX model" in m for m in refused)


def test_fuzz_model_files_short(tmp_path):
    _fuzz(tmp_path, 200)


@pytest.mark.slow
def test_fuzz_model_files_long(tmp_path):
    _fuzz(tmp_path, 5000)


def test_declared_input_sizes_a_check_cannot_draw_are_refused(tmp_path, capsys):
    """A model may declare any input size: check and optimize draw random inputs of at most
    MAX_RANDOM_ELEMENTS elements and say which input is too large instead of allocating it."""
    from opbridge import _check
    from helpers.optimize_support import group_norm_decomposition_with_table

    model = group_norm_decomposition_with_table(np.random.default_rng(0), 8, 4, [3, 3], table_rows=4)[0]
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2**40
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    too_many = f"has {2**40 * 72} elements, more than the {_check.MAX_RANDOM_ELEMENTS}"
    assert opbridge.cli.main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "input 'x' of shape [1099511627776, 8, 3, 3]" in out and too_many in out, out
    assert opbridge.cli.main(["optimize", str(path), str(tmp_path / "o.onnx")]) == 1
    out = capsys.readouterr().out
    assert "cannot check the rewrite: input 'x'" in out and too_many in out, out
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("data_type", [t for t in onnx.TensorProto.DataType.values()
                                       if t not in (TensorProto.UNDEFINED, TensorProto.STRING)])
@pytest.mark.parametrize("raw", [False, True], ids=["values", "raw"])
def test_tensors_onnx_makes_pass_the_readers_size_check(tmp_path, data_type, raw):
    """Every element type, stored as onnx.helper writes it (typed values, or raw bytes through
    numpy_helper), of an odd element count: the reader's sizes agree with onnx's packing."""
    dims = [5, 3]
    t = helper.make_tensor("t", data_type, dims, [1] * 15)
    if raw:
        t = numpy_helper.from_array(numpy_helper.to_array(t), "t")
    graph = helper.make_graph([helper.make_node("Identity", ["t"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", data_type, dims)], initializer=[t])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    assert _reader.check(proto, str(tmp_path / "m.onnx")) == []
    # One value or byte too many is refused.
    t = proto.graph.initializer[0]
    if raw:
        t.raw_data = t.raw_data + b"\0"
    else:
        field = next(f for f in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")
                     if len(getattr(t, f)))
        getattr(t, field).append(0)
    with pytest.raises(_reader.UnreadableModel, match="tensor 't' holds"):
        _reader.check(proto, str(tmp_path / "m.onnx"))


def _patched(model, old: bytes, new: bytes, path):
    data = model.SerializeToString()
    assert len(old) == len(new) and data.count(old) == 1
    path.write_bytes(data.replace(old, new))
    return path


def test_what_the_fuzzer_found_is_refused_cleanly(tmp_path, rng, capsys):
    """Cases the fuzzer found, each once a traceback or a disagreement of the two tools: an op type,
    an external data entry, a graph name that is not UTF-8 (protobuf hands out bytes), an attribute
    named twice, an opbridge node whose attribute has another type than its op declares."""
    model, _ = _model(rng)
    model.graph.node[0].op_type = "Softmax"
    bad_op = _patched(model, b"Softmax", b"Softma\xf8", tmp_path / "op.onnx")
    not_text = r"the model.graph.node\[0\].op_type is not UTF-8 text \(b'Softma\\xf8'\)"
    for argv in (["check", str(bad_op)], ["optimize", str(bad_op), str(tmp_path / "o.onnx")]):
        assert opbridge.cli.main(argv) == 2
        assert re.search(not_text, capsys.readouterr().err)
    with pytest.raises(_reader.UnreadableModel, match=not_text):
        opbridge.InferenceSession(str(bad_op))
    # A graph name that is not UTF-8: ONNX Runtime runs the model, onnx_ir cannot write it back.
    model.graph.name = "graphname"
    bad_name = _patched(model, b"graphname", b"graph\xf2ame", tmp_path / "name.onnx")
    for argv in (["check", str(bad_name)], ["optimize", str(bad_name), str(tmp_path / "o.onnx")]):
        assert opbridge.cli.main(argv) == 2
        assert "the model.graph.name is not UTF-8 text (b'graph\\xf2ame')" in capsys.readouterr().err

    path, _ = _write(tmp_path / "entry", rng, {"offset": "0000"})
    path.write_bytes(path.read_bytes().replace(b"0000", b"\xff000"))
    for argv in (["check", str(path)], ["optimize", str(path), str(tmp_path / "o.onnx")]):
        assert opbridge.cli.main(argv) == 2
        err = capsys.readouterr().err
        assert ".initializer[0].external_data[1].value is not UTF-8 text (b'\\xff000')" in err, err

    # An attribute named twice: ONNX Runtime ran the first, optimize's reader failed on the last.
    twice = _constant_model({"value": numpy_helper.from_array(np.ones(2, np.float32))})
    twice.graph.node[0].attribute.append(helper.make_attribute("value", 1))
    path = tmp_path / "twice.onnx"
    onnx.save(twice, path)
    for argv in (["check", str(path)], ["optimize", str(path), str(tmp_path / "o.onnx")]):
        assert opbridge.cli.main(argv) == 2
        assert f"{path}: node 'Constant' has attribute 'value' twice" in capsys.readouterr().err

    gn = helper.make_node("GroupNorm", ["x", "s", "b"], ["y"], domain=opbridge.DOMAIN, num_groups=2,
                          epsilon=[1.0, 2.0])
    graph = helper.make_graph([gn], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3])],
                              [numpy_helper.from_array(np.ones(4, np.float32), "s"),
                               numpy_helper.from_array(np.zeros(4, np.float32), "b")])
    path = tmp_path / "gn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid(opbridge.DOMAIN, 1)],
                                ir_version=IR_VERSION), path)
    assert opbridge.cli.main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "the model is invalid" in out and "attribute 'epsilon' must be a float, got a list of floats" in out, out
    assert "Traceback" not in out, out


def test_a_lying_channel_count_is_not_allocated(tmp_path):
    """X's dims are the file's word: a GroupNorm pattern whose X states 3 * 2**30 channels is left
    as it is, with the reason, instead of building a default scale of that many values (24 GiB:
    found by the model-file fuzzer, seed 930900551, case 186)."""
    from helpers.optimize_support import group_norm_decomposition_with_table

    model = group_norm_decomposition_with_table(np.random.default_rng(0), 8, 4, [3, 3], table_rows=4)[0]
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 3 * 2**30
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    from opbridge._optimize import optimize

    report = optimize(str(path), str(tmp_path / "o.onnx"), out=io.StringIO())
    assert "X states 3221225472 channels, more than the 16777216" in "\n".join(report.result.skipped), report
