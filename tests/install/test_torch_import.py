"""Torch only when used: the ONNX Runtime side of opbridge never imports torch, the torch side
registers the torch ops, and a torch older than the extension supports (2.11) breaks only the
torch side, with one error naming both versions and the fix.

Every case runs in a fresh interpreter, since whether torch is imported is process state.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opbridge
from helpers.onnx_models import IR_VERSION, single_node_model

HAS_TORCH = importlib.util.find_spec("torch") is not None
BUILT_TORCH = opbridge.build_info().get("torch_version", "")
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed: nothing to keep out")
needs_torch_build = pytest.mark.skipif(not (HAS_TORCH and BUILT_TORCH and opbridge.torch_library_path()),
                                       reason="opbridge was built without its torch extension")


def run_python(code: str, *, env: dict | None = None, cwd: Path | None = None) -> dict:
    """Runs `code` in a fresh interpreter; the code sets `result` (a JSON-able dict), which is
    returned with `torch_imported` added."""
    script = textwrap.dedent(code) + textwrap.dedent("""
        import json as _json, sys as _sys
        result["torch_imported"] = "torch" in _sys.modules
        print("RESULT " + _json.dumps(result))
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **(env or {})}, cwd=cwd)
    assert p.returncode == 0, f"exit {p.returncode}\n--- stdout ---\n{p.stdout}\n--- stderr ---\n{p.stderr}"
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    out["stderr"] = p.stderr
    return out


@pytest.fixture
def group_norm_model(tmp_path, rng):
    """An ai.opbridge::GroupNorm model (built with onnx alone), an input and its float64 result."""
    m = single_node_model("GroupNorm", opbridge.DOMAIN, [("X", np.float32, [2, 6, 5])], {"num_groups": 3})
    path = tmp_path / "gn.onnx"
    onnx.save(m, path)
    x = (rng.standard_normal((2, 6, 5)) * 3 + 1).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    g = x.astype(np.float64).reshape(2, 3, -1)
    y = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)
    return path, tmp_path / "x.npy", y.reshape(x.shape)


ORT_SIDE = """
    import numpy as np
    import opbridge
    result = {}
    sess = opbridge.InferenceSession(MODEL)
    y = sess.run(None, {"X": np.load(X)})[0]
    result["err"] = float(np.abs(y - np.load(EXPECTED)).max())
    result["library"] = opbridge.get_library_path()
    so = opbridge.session_options()
    result["session_options"] = type(so).__name__
"""


def _ort_side(model, x, expected, tmp_path: Path, prelude: str = "", env: dict | None = None) -> dict:
    np.save(tmp_path / "expected.npy", expected)
    code = (f"MODEL, X, EXPECTED = {str(model)!r}, {str(x)!r}, {str(tmp_path / 'expected.npy')!r}\n"
            + textwrap.dedent(prelude) + textwrap.dedent(ORT_SIDE))
    return run_python(code, env=env)


@needs_torch
def test_ort_side_never_imports_torch(group_norm_model, tmp_path):
    out = _ort_side(*group_norm_model, tmp_path)
    assert out["err"] < 1e-5
    assert out["session_options"] == "SessionOptions"
    assert not out["torch_imported"], "import opbridge / InferenceSession / session_options imported torch"


@needs_torch
def test_check_never_imports_torch(group_norm_model):
    model, _, _ = group_norm_model
    out = run_python(f"""
        from opbridge.cli import main
        result = {{"rc": main(["check", {str(model)!r}])}}
    """)
    assert out["rc"] == 0
    assert not out["torch_imported"], "opbridge check imported torch"


# Installed packages whose `opbridge.libraries` entry point would import torch: `opbridge check`
# hides torch while it loads them, so each fails (reported by name) or skips its torch side.
TORCH_PACKAGES = {
    # As the packages older `opbridge new-op` made: the torch side loads where torch is installed.
    # Hidden torch: the import skips it, and the package fails only for its (missing) library.
    "torch_side_where_installed": ("""
        import importlib.util
        if importlib.util.find_spec("torch") is not None:
            import torch
        def library_spec():
            return {"ort": "/nonexistent/liblegacy_ort.so", "namespace": "legacy", "torch": None}
    """, "cannot load the custom-op library /nonexistent/liblegacy_ort.so"),
    "imports_torch": ("import torch\n", "it imports torch"),
    "imports_torch_when_called": ("def library_spec():\n    import torch.nn\n", "it imports torch"),
}


@pytest.fixture
def torch_packages(tmp_path):
    """A folder (for PYTHONPATH) with the TORCH_PACKAGES installed, and the model of group_norm_model."""
    from helpers.scaffold_helpers import fake_op_package

    site = tmp_path / "torch_packages"
    for name, (code, _) in TORCH_PACKAGES.items():
        fake_op_package(site, name, code)
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


@needs_torch
def test_check_never_imports_torch_with_packages_that_would(group_norm_model, torch_packages):
    model, _, _ = group_norm_model
    out = run_python(f"""
        import contextlib, io
        from opbridge.cli import main
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["check", {str(model)!r}])
        result = {{"rc": rc, "out": buf.getvalue()}}
    """, env=torch_packages)
    assert out["rc"] == 0, out["out"]
    assert not out["torch_imported"], "opbridge check imported torch"
    for name, (_, says) in TORCH_PACKAGES.items():
        lines = [line for line in out["out"].splitlines() if line.startswith("skipped") and f"package {name} " in line]
        assert len(lines) == 1 and says in lines[0], (name, out["out"])


@needs_torch
def test_optimize_and_the_ort_side_never_import_torch_with_op_packages(group_norm_model, torch_packages, tmp_path):
    # `opbridge optimize` (GroupNormalization-21 -> ai.opbridge::GroupNorm, checked in ORT), then
    # InferenceSession and session_options: with users' op packages installed (those above, and
    # whatever this environment has, e.g. CI's package made by `opbridge new-op`).
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 5])
    scale = numpy_helper.from_array(np.linspace(0.5, 1.5, 6, dtype=np.float32), "scale")
    bias = numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32), "bias")
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=3)
    graph = helper.make_graph([node], "gn21", [x], [y], initializer=[scale, bias])
    src, dst = tmp_path / "gn21.onnx", tmp_path / "gn21_opt.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR_VERSION), src)
    out = run_python(f"""
        import contextlib, io
        import numpy as np
        import opbridge
        from opbridge.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            rc = main(["optimize", {str(src)!r}, {str(dst)!r}])
        sess = opbridge.InferenceSession({str(dst)!r}, opbridge.session_options())
        y = sess.run(None, {{"x": np.ones((2, 6, 5), np.float32)}})[0]
        result = {{"rc": rc, "finite": bool(np.isfinite(y).all())}}
    """, env=torch_packages)
    assert out["rc"] == 0 and out["finite"]
    assert not out["torch_imported"], "opbridge optimize / InferenceSession imported torch"
    assert [n.op_type for n in onnx.load(dst).graph.node] == ["GroupNorm"]


@needs_torch
def test_schemas_never_import_torch():
    # Importing opbridge.onnx registers the ai.opbridge OpSchemas (what `opbridge check` needs);
    # only its export functions need torch.
    out = run_python("""
        import onnx, opbridge.onnx
        result = {"schema": onnx.defs.has("GroupNorm", "ai.opbridge")}
    """)
    assert out["schema"]
    assert not out["torch_imported"], "import opbridge.onnx imported torch"


@needs_torch
def test_optimize_never_imports_torch():
    if importlib.util.find_spec("opbridge._optimize") is None:
        pytest.skip("this opbridge has no opbridge._optimize (opbridge optimize)")
    out = run_python("""
        import opbridge._optimize
        result = {}
    """)
    assert not out["torch_imported"], "import opbridge._optimize imported torch"


@needs_torch_build
@pytest.mark.parametrize("how", [
    "import torch, opbridge",          # torch first: import opbridge registers the ops
    "import opbridge, opbridge.ops",
    "import opbridge.nn",
    "import opbridge.onnx; opbridge.onnx.translation_table()",
])
def test_torch_side_registers_the_ops(how):
    out = run_python(f"""
        {how}
        import torch
        result = {{"ops": sorted(n for n in ("group_norm", "inverse") if hasattr(torch.ops.opbridge, n))}}
    """)
    assert "group_norm" in out["ops"], f"{how!r} did not register torch.ops.opbridge.group_norm"


@needs_torch_build
def test_export_load_after_import(tmp_path, rng):
    # The documented rule: a program saved with torch.export that uses our ops loads in a process
    # that has imported opbridge.ops (or torch, then opbridge).
    import torch

    import opbridge.ops

    class M(torch.nn.Module):
        def forward(self, x):
            return opbridge.ops.group_norm(x, 2)

    x = torch.from_numpy(rng.standard_normal((2, 4, 3)))
    torch.export.save(torch.export.export(M(), (x,)), tmp_path / "m.pt2")
    torch.save(x, tmp_path / "x.pt")
    load = f"""
        ep = torch.export.load({str(tmp_path / 'm.pt2')!r})
        y = ep.module()(torch.load({str(tmp_path / 'x.pt')!r}))
        result = {{"shape": list(y.shape)}}
    """
    out = run_python("import torch, opbridge\n" + textwrap.dedent(load))
    assert out["shape"] == [2, 4, 3]
    # Without opbridge the program cannot be loaded: the test above shows the import is what matters.
    with pytest.raises(AssertionError, match="opbridge"):
        run_python("import torch\n" + textwrap.dedent(load))


@needs_torch_build
def test_info_lists_torch_ops():
    p = subprocess.run([sys.executable, "-m", "opbridge", "info"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "torch.ops.opbridge.group_norm" in p.stdout


# ---- a torch older than the extension supports ----------------------------------------------
OTHER_TORCH = "2.10.0+cpu"
# Pretends the installed torch is an older release (the version check happens before any load).
FAKE_VERSION = f"import torch; torch.__version__ = {OTHER_TORCH!r}\n"


# An extension that does not load although the versions match (e.g. built against a CUDA torch,
# loaded into a CPU torch of the same release).
FAILING_LOAD = ("import torch\n"
                "def _fail(path): raise OSError('libtorch_cuda.so: cannot open shared object file')\n"
                "torch.ops.load_library = _fail\n")


@needs_torch_build
@pytest.mark.parametrize("prelude, says", [(FAKE_VERSION, OTHER_TORCH), (FAILING_LOAD, "libtorch_cuda.so")],
                         ids=["other version", "extension does not load"])
def test_torch_problems_keep_the_ort_side_working(group_norm_model, tmp_path, prelude, says):
    out = _ort_side(*group_norm_model, tmp_path, prelude=prelude)
    assert out["err"] < 1e-5
    # import opbridge after torch: the ops are not registered, and a single warning says why.
    assert out["stderr"].count("torch ops not registered") == 1 and says in out["stderr"], out["stderr"]


@needs_torch_build
@pytest.mark.parametrize("what", ["opbridge.ops", "opbridge.nn"])
def test_mismatch_is_one_clear_error(what):
    out = run_python(FAKE_VERSION + textwrap.dedent(f"""
        import importlib, warnings
        warnings.simplefilter("ignore")
        import opbridge
        try:
            importlib.import_module({what!r})
            result = {{"error": None}}
        except ImportError as e:
            result = {{"error": str(e), "type": type(e).__name__}}
    """))
    err = out["error"]
    assert err is not None, f"import {what} succeeded with torch {OTHER_TORCH}"
    assert out["type"] == "TorchVersionError"
    assert OTHER_TORCH in err and "torch>=2.11" in err, err
    assert "pip install 'torch>=2.11'" in err, err


@needs_torch
def test_broken_torch_does_not_break_the_ort_side(group_norm_model, tmp_path):
    # A torch that cannot even be imported (e.g. a build for another CUDA) shadows the real one.
    fake = tmp_path / "fake_site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('this torch is broken')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])}
    out = _ort_side(*group_norm_model, tmp_path, env=env)
    assert out["err"] < 1e-5


# ---- the torch requirement in the wheel's metadata ---------------------------------------------
@needs_torch_build
def test_metadata_requires_the_stable_abi_torch():
    try:
        requires = importlib.metadata.requires("opbridge") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("opbridge is not installed as a distribution")
    # Any torch from 2.11 on: the extension is built on the stable ABI of torch 2.11.
    for extra in ("export", "torch"):
        pins = [r for r in requires if r.replace(" ", "").startswith("torch") and f'extra=="{extra}"' in r.replace(" ", "")]
        assert len(pins) == 1, (extra, requires)
        assert pins[0].replace(" ", "").startswith("torch>=2.11;"), pins[0]
