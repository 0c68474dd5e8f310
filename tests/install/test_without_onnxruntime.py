"""opbridge does not install ONNX Runtime (either distribution would replace the other): the torch
ops and opbridge.onnx.export work without any, and what needs one (a session, `opbridge check`)
fails with one error naming both extras.

Each case runs in a fresh interpreter whose import system cannot see the installed onnxruntime:
a sitecustomize.py on PYTHONPATH replaces the path finder with one that finds no ``onnxruntime``
module, as where it is not installed (``import onnxruntime`` raises ModuleNotFoundError and
``importlib.util.find_spec`` returns None).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import opbridge

HIDE = '''
import os
import sys
from importlib.machinery import PathFinder

_HIDDEN = set(os.environ["OPBRIDGE_TEST_HIDE"].split(","))


class _Without(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in _HIDDEN:
            return None
        return super().find_spec(name, path, target)


sys.meta_path[sys.meta_path.index(PathFinder)] = _Without
'''

EXTRAS = ('pip install "opbridge[onnxruntime]"', 'pip install "opbridge[onnxruntime-gpu]"')


def _run(tmp_path: Path, code: str, *args: str, hide: str = "onnxruntime") -> subprocess.CompletedProcess:
    """python -c CODE (or python ARGS) in tmp_path, the top-level modules in `hide` (comma-separated)
    invisible to its imports."""
    site = tmp_path / "hide"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(HIDE)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, *(["-c", textwrap.dedent(code)] if code else []), *args],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": path, "OPBRIDGE_TEST_HIDE": hide})


def _result(p: subprocess.CompletedProcess) -> dict:
    assert p.returncode == 0, f"exit {p.returncode}\n--- stdout ---\n{p.stdout}\n--- stderr ---\n{p.stderr}"
    return json.loads([line for line in p.stdout.splitlines() if line.startswith("RESULT ")][-1][len("RESULT "):])


def test_the_blocker_hides_onnxruntime(tmp_path):
    pytest.importorskip("onnxruntime", reason="nothing to hide")
    out = _result(_run(tmp_path, """
        import importlib.util, json
        try:
            import onnxruntime
            error = None
        except ModuleNotFoundError as e:
            error = [type(e).__name__, e.name]
        print("RESULT " + json.dumps({"spec": importlib.util.find_spec("onnxruntime") is None, "error": error}))
    """))
    assert out == {"spec": True, "error": ["ModuleNotFoundError", "onnxruntime"]}


@pytest.mark.torch
def test_torch_ops_and_export_without_onnxruntime(tmp_path, rng):
    if not opbridge.torch_library_path():
        pytest.skip("opbridge was built without its torch extension")
    pytest.importorskip("onnxscript")
    x = (rng.standard_normal((2, 6, 5)) * 3 + 1).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = _result(_run(tmp_path, """
        import json, sys
        import numpy as np
        import onnx, torch
        import opbridge, opbridge.onnx, opbridge.ops

        x = torch.from_numpy(np.load("x.npy"))
        y = opbridge.ops.group_norm(x, 3, activation="silu")


        class Net(torch.nn.Module):
            def forward(self, x):
                return opbridge.ops.group_norm(x, 3, activation="silu")


        opbridge.onnx.export(Net(), (x,), "gn.onnx")
        nodes = [(n.domain, n.op_type) for n in onnx.load("gn.onnx").graph.node]
        try:
            opbridge.InferenceSession("gn.onnx")
            error = None
        except ModuleNotFoundError as e:
            error = str(e)
        print("RESULT " + json.dumps({"y": y.tolist(), "nodes": nodes, "error": error,
                                      "ort_imported": "onnxruntime" in sys.modules}))
    """))
    from helpers.reference import group_norm

    np.testing.assert_allclose(np.array(out["y"]), group_norm(x.astype(np.float64), 3, activation="silu"),
                               rtol=1e-5, atol=1e-5)
    assert ["ai.opbridge", "GroupNorm"] in out["nodes"]
    assert out["error"] is not None and all(extra in out["error"] for extra in EXTRAS), out["error"]
    assert not out["ort_imported"]


def test_ort_side_without_onnxruntime_names_both_extras(tmp_path):
    out = _result(_run(tmp_path, """
        import json
        import opbridge
        errors = []
        for call in (opbridge.session_options, lambda: opbridge.InferenceSession(b"")):
            try:
                call()
                errors.append(None)
            except ModuleNotFoundError as e:
                errors.append([e.name, str(e)])
        print("RESULT " + json.dumps({"errors": errors, "library": opbridge.get_library_path()}))
    """))
    assert Path(out["library"]).is_file()  # the library is found: only the runtime is missing
    for name, message in out["errors"]:
        assert name == "onnxruntime" and all(extra in message for extra in EXTRAS), message


def test_check_and_optimize_without_onnxruntime_name_both_extras(tmp_path, rng):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    from onnx import TensorProto, helper, numpy_helper

    # GroupNormalization-21, which `opbridge optimize` rewrites and then checks in ONNX Runtime.
    c = 6
    inits = [numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), "scale"),
             numpy_helper.from_array(rng.uniform(-0.5, 0.5, c).astype(np.float32), "bias")]
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=3)
    graph = helper.make_graph([node], "gn21", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", c, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", c, 5])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
              tmp_path / "gn.onnx")
    for command in (["check", "gn.onnx"], ["optimize", "gn.onnx", "out.onnx"]):
        p = _run(tmp_path, "", "-m", "opbridge", *command)
        assert p.returncode == 2, p.stdout + p.stderr
        assert "Traceback" not in p.stderr, p.stderr
        line = p.stderr.strip().splitlines()[-1]
        assert line.startswith(f"opbridge {command[0]} needs ONNX Runtime") and all(e in line for e in EXTRAS), line
    assert not (tmp_path / "out.onnx").exists()
    # Without the tools (onnx here), the commands say which extra brings them.
    for command in (["check", "gn.onnx"], ["optimize", "gn.onnx", "out.onnx"]):
        p = _run(tmp_path, "", "-m", "opbridge", *command, hide="onnx")
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert p.stderr.strip().splitlines()[-1] == (
            f"opbridge {command[0]} needs onnx, onnxscript and onnx-ir (onnx is not installed): "
            'pip install "opbridge[tools]" (onnx, onnxscript and onnx-ir; no torch)'), p.stderr


def test_metadata_leaves_the_onnxruntime_distribution_to_the_user():
    import importlib.metadata

    requirements = pytest.importorskip("packaging.requirements")
    try:
        requires = [requirements.Requirement(r) for r in importlib.metadata.requires("opbridge") or []]
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("opbridge is not installed as a distribution")

    def names(extra=None):
        """The distributions `pip install "opbridge[extra]"` asks for (opbridge[...] by its extras)."""
        env = {"extra": extra or ""}
        return {r.name + (str(sorted(r.extras)) if r.extras else "") for r in requires
                if r.marker is None or r.marker.evaluate(env)}

    # `pip install opbridge`: neither ONNX Runtime distribution, no torch.
    assert names() == {"numpy"}
    assert names("onnxruntime") == {"numpy", "onnxruntime"}
    assert names("onnxruntime-gpu") == {"numpy", "onnxruntime-gpu"}
    # What `opbridge check` / `optimize` import, and no torch.
    assert names("tools") == {"numpy", "onnx", "onnxscript", "onnx-ir"}
    assert names("export") == {"numpy", "torch", "opbridge['tools']", "onnxscript"}
