"""Declarations that cannot hurt: every backward op runs its forward's checks, and a bad
declaration is a clear error, never a crash.

One project of the fixture ops (tests/declarations/fixtures/decl_safety), built once like a user's:

* ``seg_sum`` (a segment sum whose kernels index rows with the ids) and backward ops of it
  declared in three ways: from ``args_of`` without ``gradient_of`` (named as the backward in
  Python), by hand without one of seg_sum's arguments, by hand with all of them;
* ``bad_op``, whose declaration the environment variable DECLSAFETY_CASE picks when the library
  first describes its ops (valid where it is unset), so each bad declaration is tried in a process
  of its own without a build per declaration.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opbridge
from opbridge._newop import new_op
from helpers.scaffold_helpers import env_with, pip_install

torch = pytest.importorskip("torch", reason="the fixture project's torch side")

FIXTURE = Path(__file__).parent / "fixtures" / "decl_safety"
DOMAIN = "com.example.declsafety"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    if not opbridge.build_info().get("torch_version"):
        pytest.skip("opbridge was built without torch: the fixture's torch extension cannot be built")
    root = tmp_path_factory.mktemp("declsafety")
    project = new_op("seg_sum", dir=root / "declsafety", namespace="declsafety").dir
    new_op("bad_op", dir=project)
    py_ops = project / "python" / "declsafety" / "ops"
    for op in ("seg_sum", "bad_op"):
        shutil.rmtree(project / "ops" / op)
        shutil.copytree(FIXTURE / "ops" / op, project / "ops" / op)
        (py_ops / f"{op}.py").unlink()
    shutil.copy(FIXTURE / "python" / "seg_sum.py", py_ops / "seg_sum.py")
    shutil.rmtree(project / "tests")
    pip_install(project, root / "site", root / "build")
    return project, root / "site", root / "build"


def _run(project, code: str, *args: str, case: str | None = None) -> subprocess.CompletedProcess:
    """`code` (with `args`) in a new process that sees the fixture project (DECLSAFETY_CASE=case)."""
    proj, site, _ = project
    env = env_with(site)
    env.pop("DECLSAFETY_CASE", None)
    if case is not None:
        env["DECLSAFETY_CASE"] = case
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=proj, env=env,
                          timeout=300)


def _result(p: subprocess.CompletedProcess) -> dict:
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def _save(model, path: Path) -> str:
    import onnx

    onnx.save(model, path)
    return str(path)


# ---- every backward op runs its forward's checks -----------------------------------------------

_VERDICTS = r"""
import json, re, sys
import numpy as np, onnxruntime as ort, torch
from torch._subclasses.fake_tensor import FakeTensorMode
import declsafety, declsafety.ops
from opbridge.ops import translate_errors

grad, values, ids = (np.load(sys.argv[1])[k] for k in ("grad", "values", "ids"))
op = torch.ops.declsafety.seg_sum_backward.default
args = (torch.from_numpy(grad), torch.from_numpy(values), torch.from_numpy(ids), 3)
out = {}

def verdict(name, fn, label):
    try:
        fn()
        out[name] = ["ok", ""]
    except Exception as e:
        m = re.search(label + r"(.*)", str(e), re.S)
        out[name] = [type(e).__name__, m.group(1).strip() if m else str(e)]

verdict("torch", lambda: translate_errors(op)(*args), "declsafety::seg_sum_backward: ")
def fake():
    with FakeTensorMode() as mode:
        op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
verdict("fake", fake, "declsafety::seg_sum_backward: ")
def run_ort():
    sess = ort.InferenceSession(sys.argv[2], declsafety.session_options())
    sess.run(None, {"grad": grad, "values": values, "segment_ids": ids})
verdict("ort", run_ort, r"SegSumBackward \(node '[^']*'\): ")
verdict("core", lambda: declsafety.library().ops["seg_sum_backward"].run(grad, values, ids, 3),
        "seg_sum_backward: ")
print(json.dumps(out))
"""


def _model(op_type: str, inputs: list, attrs: dict, out_shape: list):
    """One node of ours in a model; inputs: (name, onnx element type, shape)."""
    from onnx import TensorProto, helper

    node = helper.make_node(op_type, [i[0] for i in inputs], ["y"], domain=DOMAIN, name="n", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, out_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)],
                             ir_version=9)


def _backward_model(n_ids: int):
    from onnx import TensorProto

    return _model("SegSumBackward", [("grad", TensorProto.DOUBLE, [3, 4]), ("values", TensorProto.DOUBLE, [5, 4]),
                                     ("segment_ids", TensorProto.INT64, [n_ids])], {"num_segments": 3}, [5, 4])


@pytest.mark.parametrize("ids,message,checked_by_fake", [
    # The trap: an id of 99 for 3 segments, which the kernel would use as a row of grad.
    ([0, 2, 99, 1, 0], "segment_ids[2] = 99 is outside [0, num_segments = 3)", False),
    ([0, 2, -1, 1, 0], "segment_ids[2] = -1 is outside [0, num_segments = 3)", False),
    # A check on shapes, which the fake kernel runs too (it knows sizes, not values).
    ([0, 2, 1, 0], "segment_ids must have one id per row of values (5), got 4", True),
], ids=["id_above", "id_below", "id_count"])
def test_a_backward_from_args_of_runs_its_forwards_checks(project, tmp_path, rng, ids, message, checked_by_fake):
    # seg_sum_backward is declared from seg_sum's arguments (args_of) with no gradient_of and no
    # check of its own: seg_sum's checks run on them before its kernel, with the same verdict and
    # message in torch, its fake kernel, ONNX Runtime and opbridge._core.
    ids = np.array(ids, dtype=np.int64)
    data = tmp_path / "io.npz"
    np.savez(data, grad=rng.standard_normal((3, 4)), values=rng.standard_normal((5, 4)), ids=ids)
    model = _save(_backward_model(len(ids)), tmp_path / "backward.onnx")
    out = _result(_run(project, _VERDICTS, str(data), model))
    expected = ["ValueError", message]
    assert out["torch"] == expected, out
    assert out["core"] == expected, out
    assert out["ort"][1] == message, out
    assert out["fake"] == (expected if checked_by_fake else ["ok", ""]), out


def test_a_backward_op_that_cannot_run_its_forwards_checks_is_refused(project):
    # Named as seg_sum's backward (register_autograd's backward_op) without being declared from it:
    # ONNX Runtime, which learns what a backward is of from its declaration alone, would run it
    # unchecked. Refused at registration, naming both ops; a backward from args_of is accepted.
    out = _result(_run(project, r"""
import json, torch
import declsafety.ops
from opbridge.ops import register_autograd
out = {}
for bwd in ("seg_sum_grad_partial", "seg_sum_grad_unlinked", "nope", "seg_sum_backward"):
    try:
        register_autograd("declsafety::seg_sum", lambda ctx, g: (g, None, None), setup_context=lambda c, i, o: None,
                          backward_op="declsafety::" + bwd, backward_op_grads=(0,))
        out[bwd] = "ok"
    except ValueError as e:
        out[bwd] = str(e)
print(json.dumps(out))
"""))
    where = "register_autograd('declsafety::seg_sum'): backward_op declsafety::"
    assert out["seg_sum_grad_partial"].startswith(where + "seg_sum_grad_partial cannot be checked as the backward of "
                                                  "declsafety::seg_sum: its arguments do not include seg_sum's "
                                                  "num_segments"), out
    assert out["seg_sum_grad_unlinked"].startswith(where + "seg_sum_grad_unlinked does not run declsafety::seg_sum's "
                                                   "checks on its arguments"), out
    assert out["nope"].startswith(where + "nope is not an op a library opbridge knows declares"), out
    assert all(".args_of(" in out[k] for k in ("seg_sum_grad_partial", "seg_sum_grad_unlinked", "nope")), out
    assert out["seg_sum_backward"] == "ok", out



# ---- a floating output without a gradient ------------------------------------------------------

_SEG_MEAN = r"""
import json, sys
import numpy as np, onnxruntime as ort, torch
import declsafety, declsafety.ops

values, ids, w = (np.load(sys.argv[1])[k] for k in ("values", "ids", "w"))
v = torch.from_numpy(values).requires_grad_()
y, count = torch.ops.declsafety.seg_mean(v, torch.from_numpy(ids), 3)
out = {"y_requires_grad": y.requires_grad, "count_requires_grad": count.requires_grad,
       "y": y.detach().tolist(), "count": count.tolist()}
(y * torch.from_numpy(w)).sum().backward()  # count, a constant, adds nothing
out["grad"] = v.grad.tolist()
try:
    count.sum().backward()
    out["count_backward"] = "ran"
except RuntimeError as e:
    out["count_backward"] = str(e)
bwd = declsafety.library().ops["seg_mean_backward"]
out["backward_inputs"] = [i.name for i in bwd.inputs]
sess = ort.InferenceSession(sys.argv[2], declsafety.session_options())
y_ort, count_ort = sess.run(None, {"values": values, "segment_ids": ids})
out["y_ort"], out["count_ort"] = y_ort.tolist(), count_ort.tolist()
print(json.dumps(out))
"""


def test_a_floating_output_declared_not_differentiable_has_no_gradient(project, tmp_path, rng):
    # seg_mean's count is a float output declared not_differentiable(): autograd treats it as a
    # constant, and its backward (gradient_of) takes y's gradient only, plus the forward's count.
    from onnx import TensorProto, helper

    values = rng.standard_normal((7, 4))
    ids = np.array([0, 2, 2, 0, 2, 1, 0], dtype=np.int64)
    w = rng.standard_normal((3, 4))
    np.savez(tmp_path / "in.npz", values=values, ids=ids, w=w)
    node = helper.make_node("SegMean", ["values", "segment_ids"], ["y", "count"], domain=DOMAIN, name="n",
                            num_segments=3)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("values", TensorProto.DOUBLE, [7, 4]),
         helper.make_tensor_value_info("segment_ids", TensorProto.INT64, [7])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3, 4]),
         helper.make_tensor_value_info("count", TensorProto.DOUBLE, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)],
                              ir_version=9)
    out = _result(_run(project, _SEG_MEAN, str(tmp_path / "in.npz"), _save(model, tmp_path / "m.onnx")))

    count = np.array([3.0, 1.0, 3.0])  # rows of segments 0, 1 and 2
    y = np.stack([values[ids == s].sum(axis=0) / count[s] for s in range(3)])
    assert out["y_requires_grad"] and not out["count_requires_grad"], out
    np.testing.assert_allclose(out["y"], y, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(out["count"], count)
    np.testing.assert_allclose(out["grad"], w[ids] / count[ids][:, None], rtol=1e-12, atol=1e-12)
    assert "does not require grad" in out["count_backward"], out["count_backward"]
    assert out["backward_inputs"] == ["grad", "count", "values", "segment_ids"], out["backward_inputs"]
    np.testing.assert_allclose(out["y_ort"], y, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(out["count_ort"], count)

# ---- a bad declaration is a clear error, never a crash ----------------------------------------

# (DECLSAFETY_CASE, the op's name, what its declaration error says). torch's schema parser refuses
# most of the first ones: where such a schema reached torch's library-definition call while the
# library loaded, the process ended. Python's signatures refuse a required list after a default
# and a Python keyword as a name, Python's decoder bytes that are not UTF-8; the last ones break
# the declaration's own rules.
BAD_DECLARATIONS = [
    ("optional_before_required", "bad_op",
     "argument weight: a required input cannot follow the optional input bias"),
    ("required_attr_after_default", "bad_op",
     "argument k: a required attribute cannot follow the attribute with a default scale"),
    ("required_list_after_default", "bad_op",
     "argument sizes: a required attribute cannot follow the attribute with a default scale"),
    ("torch_keyword_name", "bad_op", "argument in: name is a reserved word of torch schemas and Python"),
    ("keyword_op_name", "if", "name 'if' is a reserved word of torch schemas and Python"),
    ("subnormal_default", "bad_op",
     "argument scale: default must be 0 or of magnitude >= 2.2250738585072014e-308 (torch cannot read the "
     "subnormal 1e-310)"),
    ("nonfinite_list_default", "bad_op", "argument weights: default[1] must be finite, got inf"),
    ("string_nul_character", "bad_op", "argument mode: default holds a NUL character at position 1"),
    ("string_not_utf8", "bad_op", "argument mode: default is not valid UTF-8 (byte 3)"),
    ("python_keyword_name", "bad_op", "argument lambda: name is a reserved word of torch schemas and Python"),
    ("duplicate_name", "bad_op", "argument x: declared twice"),
    ("bad_name", "bad_op", "argument 2k: name is not a valid identifier"),
    ("unbound_output_type", "bad_op", "output y: type variable 'U' is bound by no required input"),
    ("bad_shape_rule", "bad_op", "output y: cannot read shape rule 'x[0' at position 3: expected ']'"),
]

_LOAD = r"""
import json, sys, warnings
import numpy as np, onnxruntime as ort, torch
from opbridge import MisdeclaredOpError

name = sys.argv[1]
out = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import declsafety  # with torch imported: its torch side too, which only warns here
out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
lib = declsafety.library()  # the ORT side: registers, whatever one declaration says
out["refused"] = {k: v[1] for k, v in lib.refused.items()}
try:
    import declsafety.ops  # the torch side, asked for
    out["import"] = None
except MisdeclaredOpError as e:
    out["import"] = [str(e), sorted(e.ops)]
out["torch_op"] = hasattr(torch.ops.declsafety, name)
# The library's other ops, in torch and ONNX Runtime.
io = np.load(sys.argv[2])
y = torch.ops.declsafety.seg_sum(torch.from_numpy(io["values"]), torch.from_numpy(io["ids"]), 3)
out["torch_error"] = float(np.abs(y.numpy() - io["y"]).max())
sess = ort.InferenceSession(sys.argv[3], declsafety.session_options())
out["ort_error"] = float(np.abs(sess.run(None, {"values": io["values"], "segment_ids": io["ids"]})[0] - io["y"]).max())
try:
    sess = ort.InferenceSession(sys.argv[4], declsafety.session_options())
    out["ort_bad"] = ["ok", sess.run(None, {"x": io["x"]})[0].tolist()]
except Exception as e:
    out["ort_bad"] = ["session", str(e)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def load_inputs(project, tmp_path_factory):
    """Inputs of seg_sum with its float64 result, a SegSum and a BadOp model (paths)."""
    from onnx import TensorProto

    rng = np.random.default_rng()
    root = tmp_path_factory.mktemp("load")
    values, ids = rng.standard_normal((6, 4)), np.array([0, 2, 1, 1, 0, 2], dtype=np.int64)
    y = np.zeros((3, 4))
    for i, s in enumerate(ids):
        y[s] += values[i]
    np.savez(root / "io.npz", values=values, ids=ids, y=y, x=rng.standard_normal((2, 3)))
    seg = _model("SegSum", [("values", TensorProto.DOUBLE, [6, 4]), ("segment_ids", TensorProto.INT64, [6])],
                 {"num_segments": 3}, [3, 4])
    bad = _model("BadOp", [("x", TensorProto.DOUBLE, [2, 3])], {}, [2, 3])
    return str(root / "io.npz"), _save(seg, root / "seg_sum.onnx"), _save(bad, root / "bad_op.onnx")


@pytest.mark.parametrize("case,name,error", BAD_DECLARATIONS, ids=[c[0] for c in BAD_DECLARATIONS])
def test_a_bad_declaration_is_refused_by_name_and_the_other_ops_work(project, load_inputs, case, name, error):
    # Each in a process of its own: a refusal that ended the process would fail this test alone.
    p = _run(project, _LOAD, name, *load_inputs, case=case)
    out = _result(p)
    expected = f"op {name}: {error}"
    assert out["refused"] == {name: out["refused"].get(name)} and expected in out["refused"][name], out
    # Python: importing the torch side raises, naming the op and what is wrong with it (importing
    # the package, which loads it where torch is imported, warns so) ...
    message, ops = out["import"]
    assert ops == [name] and expected in message and "misdeclared op" in message, message
    assert len(out["warnings"]) == 1 and expected in out["warnings"][0], out["warnings"]
    # ... the op is neither in torch nor in ONNX Runtime, where a model using it fails at session
    # creation naming it; the library's other ops work in both.
    assert not out["torch_op"], out
    assert out["torch_error"] < 1e-12 and out["ort_error"] < 1e-12, out
    kind, text = out["ort_bad"]
    assert kind == "session", out
    assert f"{DOMAIN}::BadOp (node 'n'): op {name} is misdeclared, so this library does not run it: " in text, text
    assert expected in text, text


def test_a_string_default_reaches_torch_as_written(project, load_inputs):
    # Quotes, backslashes, tabs and newlines in a string default are escaped in the torch schema
    # (unescaped, torch's parser refused the schema and the process ended).
    out = _result(_run(project, r"""
import json, sys
import numpy as np, torch
import declsafety.ops
op = torch.ops.declsafety.bad_op.default
x = torch.from_numpy(np.load(sys.argv[1])["x"])
print(json.dumps({"default": op._schema.arguments[2].default_value, "error": float((op(x) - 1.0 * x).abs().max())}))
""", load_inputs[0], case="quoted_string_default"))
    assert out == {"default": 'say "hi" \\ 2\tok\n', "error": 0.0}, out


def test_the_build_refuses_a_bad_declaration(project, load_inputs):
    # The check opbridge_add_op runs once it links the ORT library: the build fails naming the op
    # and what is wrong, and leaves no library behind; the valid declaration builds again.
    from helpers.cmake_helpers import require_toolchain

    _, _, build = project
    (lib,) = build.rglob("libdeclsafety_ort.so")
    lib.unlink()  # links again (only that) and so checks again
    cmd = [require_toolchain(), "--build", str(build)]
    env = {**os.environ, "DECLSAFETY_CASE": "optional_before_required"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    text = p.stdout + p.stderr
    assert p.returncode != 0, text
    assert "misdeclared ops" in text and "op bad_op: argument weight: a required input cannot follow the optional " \
        "input bias" in text, text
    assert not lib.exists()
    env.pop("DECLSAFETY_CASE")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0 and lib.exists(), p.stdout + p.stderr


def test_a_default_of_another_type_does_not_compile(tmp_path):
    # attr_int("k", 2.5) would be k = 2 and attr_bool("flag", "no") true, silently: the overloads
    # that would take them are deleted, so the compiler names the call.
    from importlib.resources import files

    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    include = str(files("opbridge") / "include")
    for call in ('.attr_int("k", 2.5)', '.attr_bool("flag", "no")', '.attr_string("mode", 0)'):
        src = tmp_path / "decl.cpp"
        src.write_text('#include <opbridge/op_decl.h>\nvoid f() { opbridge::OpDecl("f", "F").input("x", "T")'
                       f'{call}; }}\n')
        p = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-I", include, str(src)], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode != 0 and "deleted" in p.stderr, (call, p.stderr[-2000:])
    src.write_text('#include <opbridge/op_decl.h>\nvoid f() { opbridge::OpDecl("f", "F").input("x", "T")'
                   '.attr_int("k", 2).attr_int("n", "doc").required().attr_bool("flag", true)'
                   '.attr_string("mode", "none").attr_float("eps", 1); }\n')
    p = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-I", include, str(src)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]


def test_opbridge_check_and_session_name_a_misdeclared_op(project, load_inputs):
    p = _run(project, "import sys; from opbridge.cli import main; sys.exit(main(['check', sys.argv[1]]))",
             load_inputs[2], case="torch_keyword_name")
    text = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 1, text
    assert (f"{DOMAIN}::BadOp" in text and "misdeclared in the library libdeclsafety_ort.so, which does not run it: "
            "op bad_op: argument in: name is a reserved word" in text), text
    out = _result(_run(project, r"""
import json, sys
import opbridge, declsafety
try:
    opbridge.InferenceSession(sys.argv[1], declsafety.session_options())
    print(json.dumps("ok"))
except opbridge.MisdeclaredOpError as e:
    print(json.dumps(str(e)))
""", load_inputs[2], case="torch_keyword_name"))
    assert "op bad_op: argument in: name is a reserved word" in out, out


def test_a_schema_torch_refuses_for_another_reason_leaves_that_op_out(project, load_inputs):
    # What no declaration can know: torch has an op of that name already (here defined from Python
    # before the library loads). torch refuses that schema; the op is left out, said on stderr, and
    # the library's other ops load, where a refusal during the library's load used to end the process.
    p = _run(project, r"""
import json, sys
import numpy as np, torch
lib = torch.library.Library("declsafety", "FRAGMENT")
lib.define("seg_sum(Tensor x) -> Tensor")
torch.ops.load_library(sys.argv[2])
x = torch.from_numpy(np.load(sys.argv[1])["x"])
print(json.dumps(float((torch.ops.declsafety.bad_op(x, 2.0) - 2.0 * x).abs().max())))
""", load_inputs[0], str(project[1] / "declsafety" / "libdeclsafety_torch.so"))
    assert _result(p) == 0.0, p.stderr
    assert ("opbridge: an op of torch namespace declsafety is not registered: torch refused its schema "
            "seg_sum(Tensor values, Tensor segment_ids, int num_segments) -> Tensor") in p.stderr, p.stderr
