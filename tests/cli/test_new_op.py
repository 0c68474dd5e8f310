"""`opbridge new-op`: the scaffold of a project of your own ops. Its files (pins, comments,
placeholders), adding a second op, refusing bad names and overwrites; and, end to end, that
`pip install --no-build-isolation DIR` builds it and its generated tests pass as generated, and
that `opbridge check` finds its library through the entry point the project announces."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import opbridge
from opbridge._newop import new_op, pascal
from opbridge.cli import main as cli_main
from helpers.scaffold_helpers import pip_install, run_project_tests, run_python, run_readme_block

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = None


def test_scaffold_files(tmp_path):
    made = new_op("scaled_add", dir=tmp_path / "proj", namespace="myops", domain="com.example.myops")
    root = made.dir
    rel = sorted(str(p.relative_to(root)) for p in made.files)
    assert rel == sorted([
        ".gitignore", "CMakeLists.txt", "README.md", "pyproject.toml",
        "ops/scaled_add/scaled_add.h", "ops/scaled_add/scaled_add_decl.cpp", "ops/scaled_add/scaled_add_cpu.cpp",
        "python/myops/__init__.py", "python/myops/_library.py", "python/myops/ops/__init__.py",
        "python/myops/ops/scaled_add.py", "tests/test_scaled_add.py"])
    for f in made.files:
        text = f.read_text()
        assert not re.search(r"@[A-Za-z_]+@", text), f"placeholder left in {f}"
    decl = (root / "ops/scaled_add/scaled_add_decl.cpp").read_text()
    assert 'OpDecl("scaled_add", "ScaledAdd", 1)' in decl and 'OpDecl("scaled_add_backward", "ScaledAddBackward", 1)' in decl
    cmake = (root / "CMakeLists.txt").read_text()
    assert re.findall(r"^opbridge_add_op\(.*\)$", cmake, re.M) == [
        "opbridge_add_op(scaled_add LIBRARY myops DOMAIN com.example.myops NAMESPACE myops)"]
    major, minor = opbridge.__version__.split(".")[:2]
    assert f"find_package(opbridge {major}.{minor} CONFIG REQUIRED)" in cmake


@pytest.mark.skipif(tomllib is None, reason="tomllib needs Python 3.11")
def test_pyproject_pins_and_comments(tmp_path):
    root = new_op("scaled_add", dir=tmp_path / "proj", namespace="myops").dir
    text = (root / "pyproject.toml").read_text()
    meta = tomllib.loads(text)
    major, minor = (int(v) for v in opbridge.__version__.split(".")[:2])
    deps = meta["project"]["dependencies"]
    extras = meta["project"]["optional-dependencies"]
    # SameMinorVersion CMake package: this minor version only. Nothing else: the ORT side needs no
    # torch, and a dependency on one ONNX Runtime distribution would replace the other.
    pin = f">={major}.{minor},<{major}.{minor + 1}"
    assert deps == [f"opbridge{pin}"]
    assert extras["onnxruntime"] == [f"opbridge[onnxruntime]{pin}"]
    assert extras["onnxruntime-gpu"] == [f"opbridge[onnxruntime-gpu]{pin}"]
    assert f"opbridge[export]{pin}" in extras["test"]
    assert meta["project"]["requires-python"] == ">=3.10"
    if opbridge.build_info().get("torch_version"):
        # The stable ABI: any torch from the release opbridge targets on, to build and to run.
        assert extras["torch"] == ["torch>=2.11"]
        assert "torch>=2.11" in meta["build-system"]["requires"]
    assert meta["build-system"]["build-backend"] == "scikit_build_core.build"
    # A module that imports neither torch nor the package's torch side (test_torch_free_until_used).
    assert meta["project"]["entry-points"]["opbridge.libraries"] == {"myops": "myops._library:library_spec"}
    assert meta["tool"]["scikit-build"]["wheel"]["packages"] == ["python/myops"]
    # Every [tool.scikit-build] key has a one-line comment saying why, right above it.
    section = text.split("[tool.scikit-build]", 1)[1].split("\n[", 1)[0]
    lines = [line for line in section.splitlines() if line.strip()]
    keys = [i for i, line in enumerate(lines) if re.match(r"^[a-z][\w.-]* =", line)]
    assert len(keys) >= 6
    for i in keys:
        assert lines[i - 1].startswith("# "), f"no comment above {lines[i]!r}"


def test_defaults_from_the_folder(tmp_path):
    root = new_op("rms_norm", dir=tmp_path / "fused_ops").dir
    assert (root / "python/fused_ops/ops/rms_norm.py").is_file()
    assert "opbridge_add_op(rms_norm LIBRARY fused_ops DOMAIN com.example.fused_ops NAMESPACE fused_ops)" in \
        (root / "CMakeLists.txt").read_text()
    assert pascal("rms_norm") == "RmsNorm" and pascal("ms_deform_attn2d") == "MsDeformAttn2d"


def test_second_op_joins_the_project(tmp_path):
    root = new_op("first_op", dir=tmp_path / "proj", namespace="myops").dir
    made = new_op("second_op", dir=root, cuda=True)
    assert not made.created_project
    cmake = (root / "CMakeLists.txt").read_text()
    assert re.findall(r"^opbridge_add_op\(.*\)$", cmake, re.M) == [
        "opbridge_add_op(first_op LIBRARY myops DOMAIN com.example.myops NAMESPACE myops)",
        "opbridge_add_op(second_op LIBRARY myops)"]
    assert "enable_language(CUDA)" in cmake  # --cuda on the second op brings the CUDA option
    assert sorted(p.name for p in (root / "ops/second_op").iterdir()) == [
        "second_op.h", "second_op_cpu.cpp", "second_op_decl.cpp", "second_op_kernel.cu"]
    assert (root / "python/myops/ops/second_op.py").is_file() and (root / "tests/test_second_op.py").is_file()
    # Both functions, statically visible to type checkers in the ops module (run time imports them anyway).
    ops_init = (root / "python/myops/ops/__init__.py").read_text()
    assert ops_init.endswith("if TYPE_CHECKING:\n    from .first_op import first_op as first_op\n"
                             "    from .second_op import second_op as second_op\n"), ops_init
    with pytest.raises(ValueError, match="would overwrite"):
        new_op("second_op", dir=root)
    with pytest.raises(ValueError, match="namespace 'myops', not 'other'"):
        new_op("third_op", dir=root, namespace="other")


@pytest.mark.parametrize("kwargs,match", [
    (dict(name="RmsNorm"), "snake_case"),
    (dict(name="rms__norm"), "snake_case"),
    (dict(name="rms_norm", namespace="my-ops"), "identifier"),
    (dict(name="rms_norm", namespace="opbridge"), "taken"),
    (dict(name="rms_norm", domain="ai.opbridge"), "not yours"),
    (dict(name="rms_norm", domain="bad domain"), "domain may only hold"),
])
def test_bad_names_are_refused(tmp_path, kwargs, match):
    name = kwargs.pop("name")
    with pytest.raises(ValueError, match=match):
        new_op(name, dir=tmp_path / "proj", **kwargs)
    assert not (tmp_path / "proj").exists()


def test_refuses_a_folder_that_is_not_a_project(tmp_path):
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a project made by `opbridge new-op`"):
        new_op("rms_norm", dir=tmp_path / "stuff")


def test_cli(tmp_path, capsys):
    assert cli_main(["new-op", "rms_norm", "--dir", str(tmp_path / "p"), "--namespace", "myops"]) == 0
    out = capsys.readouterr().out
    assert "created" in out and "pip install --no-build-isolation" in out
    assert cli_main(["new-op", "Bad", "--dir", str(tmp_path / "q")]) == 2
    assert "snake_case" in capsys.readouterr().err


@pytest.mark.parametrize("change,match", [
    (lambda root: (root / "ops/scaled_add/scaled_add_decl.cpp").unlink(), r"scaled_add_decl\.cpp does not exist"),
    (lambda root: _edit(root / "CMakeLists.txt", "DOMAIN com.example.myops", "DOMAIN ai.opbridge"),
     "DOMAIN ai.opbridge is opbridge's own"),
    (lambda root: _edit(root / "CMakeLists.txt", "LIBRARY myops DOMAIN com.example.myops",
                        "LIBRARY myops DOMAIN com.example.myops BOGUS"), "unknown arguments BOGUS"),
    (lambda root: _edit(root / "CMakeLists.txt", ")\n\n# ---- the libraries",
                        ")\nopbridge_add_op(scaled_add2 LIBRARY myops DOMAIN com.example.other)\n\n# ---- the libraries"),
     "registers its ops in domain com.example.myops, not com.example.other"),
    # An adapter file of an earlier scaffold is refused by name, not silently left out.
    (lambda root: (root / "ops/scaled_add/scaled_add_ort.cpp").write_text("// an adapter written by hand\n"),
     r"adapters written by hand \(scaled_add_ort\.cpp\), which this opbridge no longer builds"),
])
def test_opbridge_add_op_errors_name_the_problem(tmp_path, change, match):
    """The one opbridge_add_op (installed with the CMake package) stops with a clear message."""
    from helpers.cmake_helpers import configure

    root = new_op("scaled_add", dir=tmp_path / "proj", namespace="myops", domain="com.example.myops").dir
    change(root)
    p = configure(root, tmp_path / "build", {"opbridge_DIR": opbridge.cmake_dir()}, check=False)
    assert p.returncode != 0
    assert re.search(match, re.sub(r"\s+", " ", p.stderr)), p.stderr[-3000:]


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


# ---- end to end: built by pip, generated tests as generated -----------------------------------
torch = pytest.importorskip("torch", reason="the scaffold's tests use torch")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if not opbridge.build_info().get("torch_version"):
        pytest.skip("opbridge was built without torch: the scaffold's torch extension cannot be built")
    root = tmp_path_factory.mktemp("new_op")
    project = new_op("scaled_mul", dir=root / "myproj", namespace="myproj").dir
    pip_install(project, root / "site", root / "build")
    return project, root / "site"


def test_generated_project_builds_and_its_tests_pass(built):
    project, site = built
    out = run_project_tests(project, site)
    assert re.search(r"\b4 passed\b", out), out


def test_generated_package_passes_mypy_strict(built, pytestconfig, tmp_path):
    # With the project's own [tool.mypy] (strict), as its author would run it, against the
    # installed (typed) opbridge.
    project = built[0]
    _mypy_passes(project, pytestconfig)
    # A user's code that imports the op from the ops module gets the function's own type (strict
    # mypy refuses a name the module does not define statically, and returning Any).
    (tmp_path / "use_op.py").write_text(
        "import torch\n"
        "from myproj.ops import scaled_mul\n\n\n"
        "def scaled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:\n"
        "    return scaled_mul(x, w, alpha=2.0)\n")
    _mypy_passes(project, pytestconfig, "--config-file", str(project / "pyproject.toml"),
                 str(tmp_path / "use_op.py"), cwd=tmp_path, mypy_path=project / "python")


def test_installed_package_requires_neither_torch_nor_onnxruntime(built):
    # The built wheel's metadata, as pip installed it: the ORT side is torch-free at install too.
    from packaging.requirements import Requirement

    project, site = built
    (info,) = site.glob("myproj-*.dist-info")
    requires = [Requirement(line.split(":", 1)[1]) for line in (info / "METADATA").read_text().splitlines()
                if line.startswith("Requires-Dist:")]
    base = [r for r in requires if r.marker is None]
    assert [(r.name, r.extras) for r in base] == [("opbridge", set())], base
    by_extra = {e: sorted((r.name, tuple(sorted(r.extras))) for r in requires
                          if r.marker is not None and r.marker.evaluate({"extra": e}))
                for e in ("torch", "onnxruntime", "onnxruntime-gpu")}
    assert by_extra == {"torch": [("torch", ())], "onnxruntime": [("opbridge", ("onnxruntime",))],
                        "onnxruntime-gpu": [("opbridge", ("onnxruntime-gpu",))]}
    # And opbridge itself requires numpy only (tests/test_without_onnxruntime.py).


def test_generated_op_builds_its_autograd_graph_in_cpp(built):
    # The scaffold's backward op is declared gradient_of the forward: the graph is built in C++ and
    # the first-order gradients are the backward op's.
    project, site = built
    out = run_python(["-c", """
import torch, myproj
x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
w = torch.randn(4, dtype=torch.float64, requires_grad=True)
y = myproj.scaled_mul(x, w, 1.5)
gx, gw = torch.autograd.grad(y, [x, w], torch.ones_like(y))
torch.testing.assert_close(gx, (1.5 * w).expand(3, 4).detach())
torch.testing.assert_close(gw, 1.5 * x.detach().sum(0))
print(y.grad_fn.name())
"""], site, project)
    assert "OpbridgeBackward[myproj::scaled_mul]" in out.stdout, out.stdout + out.stderr


def test_index_output_scaffold(tmp_path, pytestconfig):
    # --index-output: a second output of int64 indices, without a gradient (the backward takes y's
    # gradient only). The generated tests pass (check_op: indices compared exactly, gradients, both
    # exporters, ONNX Runtime), and so does the README's block.
    if not opbridge.build_info().get("torch_version"):
        pytest.skip("opbridge was built without torch: the scaffold's torch extension cannot be built")
    with pytest.raises(ValueError, match="--index-output makes a CPU op"):
        new_op("peak_mul", dir=tmp_path / "cudaproj", index_output=True, cuda=True)
    project = new_op("peak_mul", dir=tmp_path / "idxproj", namespace="idxproj", index_output=True).dir
    assert '.output("peak", "I", "x[-1]"' in (project / "ops" / "peak_mul" / "peak_mul_decl.cpp").read_text()
    pip_install(project, tmp_path / "site", tmp_path / "build")
    out = run_project_tests(project, tmp_path / "site")
    assert re.search(r"\b4 passed\b", out), out
    run_readme_block(project, tmp_path / "site", tmp_path, check=(
        "import numpy as np\n"
        "assert peak_ort.dtype == np.int64 and not y[1].requires_grad\n"
        "np.testing.assert_array_equal(peak_ort, y[1].numpy())\n"
        "np.testing.assert_array_equal(y[1].numpy(), (x * weight).numpy().argmax(0))\n"
        "print('same result')\n"))
    # The op function's return type (a pair) type-checks too.
    _mypy_passes(project, pytestconfig)


def _mypy_passes(project, pytestconfig, *args, cwd=None, mypy_path=None):
    pytest.importorskip("mypy")
    # One cache for every run: checking torch's stubs from cold takes most of a run's time.
    # (pytest's cache, or a folder of the system's temp dir where -p no:cacheprovider turns it off)
    cache = (pytestconfig.cache.mkdir("mypy") if getattr(pytestconfig, "cache", None) is not None
             else Path(tempfile.gettempdir()) / "opbridge-mypy-cache")
    env = dict(os.environ, MYPYPATH=str(mypy_path)) if mypy_path is not None else None
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache), *args],
                       capture_output=True, text=True, cwd=cwd or project, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_generated_readme_example_runs(built, tmp_path):
    # The README's Python block, as a user copies it: torch op, export, ONNX Runtime.
    project, site = built
    # ... and ORT's result is the op's (the block's own names; y = x * weight, alpha 1).
    run_readme_block(project, site, tmp_path, check=(
        "import numpy as np\n"
        "np.testing.assert_allclose(y.numpy(), x.numpy() * weight.numpy(), rtol=1e-6)\n"
        "np.testing.assert_allclose(y_ort, y.numpy(), rtol=1e-6, atol=1e-7)\n"
        "print('same result')\n"))


def test_opbridge_check_discovers_the_library(built, tmp_path):
    project, site = built
    model = tmp_path / "m.onnx"
    run_python(["-c", f"""
import torch, opbridge.onnx, myproj
class M(torch.nn.Module):
    def forward(self, x):
        return myproj.scaled_mul(x, torch.full((4,), 1.5), -2.0) + 1
opbridge.onnx.export(M(), (torch.randn(2, 4),), {str(model)!r})
"""], site, project)
    # Found through the project's `opbridge.libraries` entry point: no --library needed.
    ok = run_python(["-m", "opbridge", "check", model], site, project, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "com.example.myproj::ScaledMul" in ok.stdout and "libmyproj_ort.so" in ok.stdout
    missing = run_python(["-m", "opbridge", "check", "--no-discover", model], site, project, check=False)
    assert missing.returncode == 1, missing.stdout


def _scaled_mul_model(tmp_path, rng):
    """com.example.myproj::ScaledMul (built with onnx alone), inputs and the float64 result."""
    import numpy as np
    import onnx
    from helpers.onnx_models import single_node_model

    model = single_node_model("ScaledMul", "com.example.myproj", [("x", np.float64, [3, 5]), ("weight", np.float64, [5])],
                              {"alpha": -0.75})
    onnx.save(model, tmp_path / "scaled_mul.onnx")
    x, w = rng.standard_normal((3, 5)), rng.standard_normal(5) + 2
    np.savez(tmp_path / "io.npz", x=x, w=w, y=-0.75 * x * w)
    return tmp_path / "scaled_mul.onnx", tmp_path / "io.npz"


def test_torch_free_until_used(built, tmp_path, rng):
    """The package's ORT side imports no torch; its torch side loads on first use, or with the
    package where torch was imported first (as opbridge's)."""
    project, site = built
    model, io = _scaled_mul_model(tmp_path, rng)
    out = run_python(["-c", f"""
import sys
import tempfile
import numpy as np
import opbridge, myproj
io = np.load({str(io)!r})
print("after import:", "torch" in sys.modules)
sess = opbridge.InferenceSession({str(model)!r}, myproj.session_options())
print("ort error:", np.abs(sess.run(None, {{"x": io["x"], "weight": io["w"]}})[0] - io["y"]).max())
print("after the ORT side:", "torch" in sys.modules)
import torch
print("torch op before first use:", hasattr(torch.ops.myproj, "scaled_mul"))
y = myproj.scaled_mul(torch.from_numpy(io["x"]), torch.from_numpy(io["w"]), -0.75)
print("torch error:", np.abs(y.numpy() - io["y"]).max())
"""], site, project).stdout
    assert "after import: False" in out and "after the ORT side: False" in out, out
    assert "torch op before first use: False" in out, out
    errors = [float(line.split(":")[1]) for line in out.splitlines() if line.endswith(tuple("0123456789")) and "error:" in line]
    assert len(errors) == 2 and max(errors) < 1e-12, out
    out = run_python(["-c", "import torch, myproj; print('torch op:', hasattr(torch.ops.myproj, 'scaled_mul'))"],
                     site, project).stdout
    assert "torch op: True" in out, out


def test_check_is_torch_free_with_a_package_of_an_older_new_op(built, tmp_path, rng):
    """A package as `opbridge new-op` made them before: the entry point is its __init__, which
    loads the torch side wherever torch is installed. opbridge check hides torch while it loads
    entry points: the library is found, and torch stays out."""
    import json

    project, site = built
    old = tmp_path / "site"
    shutil.copytree(site, old)
    init = old / "myproj" / "__init__.py"
    init.write_text(init.read_text() + '\nimport importlib.util\n\nif importlib.util.find_spec("torch") is not None:\n'
                    '    from . import ops  # noqa: F401\n')
    (entry_points,) = old.glob("myproj-*.dist-info/entry_points.txt")
    entry_points.write_text(entry_points.read_text().replace("myproj._library:library_spec", "myproj:library_spec"))
    probe = "import sys, json; {}; print('RESULT', json.dumps({{'torch': 'torch' in sys.modules, 'rc': rc}}))"

    def result(code):
        line = run_python(["-c", probe.format(code)], old, project).stdout.split("RESULT ")[-1]
        return json.loads(line)

    assert result("import myproj; rc = 0")["torch"], "the older package's import no longer imports torch"
    model, _ = _scaled_mul_model(tmp_path, rng)
    checked = result(f"from opbridge.cli import main; rc = main(['check', {str(model)!r}])")
    assert checked == {"torch": False, "rc": 0}


def _nvcc():
    default = Path("/usr/local/cuda/bin/nvcc")
    return shutil.which("nvcc") or (str(default) if default.exists() else None)


@pytest.mark.slow
def test_cuda_scaffold_compiles(tmp_path):
    """--cuda: the CUDA kernel and its compute function compile with nvcc and link into the ORT
    library and (with torch) the torch extension, which still load and run the CPU op on a
    machine without a GPU."""
    from helpers.cmake_helpers import build, configure

    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("no nvcc: the CUDA sources cannot be compiled here")
    project = new_op("scaled_mul", dir=tmp_path / "cudaproj", namespace="cudaproj", cuda=True).dir
    configure(project, tmp_path / "build", {"opbridge_DIR": opbridge.cmake_dir(), "CUDAPROJ_WITH_CUDA": "ON",
                                            "CMAKE_CUDA_COMPILER": nvcc, "CMAKE_CUDA_ARCHITECTURES": "90"})
    build(tmp_path / "build")
    lib = tmp_path / "build" / "libcudaproj_ort.so"
    assert lib.is_file()
    import numpy as np
    import onnxruntime as ort
    from helpers.onnx_models import single_node_model

    m = single_node_model("ScaledMul", "com.example.cudaproj", [("x", np.float64, [3, 4]), ("weight", np.float64, [4])],
                          {"alpha": 0.5})
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(lib))
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng()
    x, w = rng.standard_normal((3, 4)), rng.standard_normal(4)
    np.testing.assert_allclose(sess.run(None, {"x": x, "weight": w})[0], 0.5 * x * w, rtol=1e-12)
    torch_lib = tmp_path / "build" / "libcudaproj_torch.so"
    if opbridge.build_info().get("torch_version"):
        assert torch_lib.is_file()
        out = subprocess.run([sys.executable, "-c", f"""
import torch, opbridge
torch.ops.load_library({str(torch_lib)!r})
x, w = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
torch.testing.assert_close(torch.ops.cudaproj.scaled_mul(x, w, 0.5), 0.5 * x * w)
print("ok")
"""], capture_output=True, text=True, timeout=300)
        assert out.stdout.strip() == "ok", out.stderr[-3000:]


# ---- the --cuda scaffold on a GPU --------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda_scaffold(tmp_path_factory):
    """A --cuda project built for this machine's GPU: (ORT library, torch library)."""
    from helpers.cmake_helpers import build, configure

    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("no nvcc: the CUDA sources cannot be compiled here")
    root = tmp_path_factory.mktemp("cuda_scaffold")
    project = new_op("scaled_mul", dir=root / "gpuproj", namespace="gpuproj", cuda=True).dir
    configure(project, root / "build", {"opbridge_DIR": opbridge.cmake_dir(), "GPUPROJ_WITH_CUDA": "ON",
                                        "CMAKE_CUDA_COMPILER": nvcc, "CMAKE_CUDA_ARCHITECTURES": "native"})
    build(root / "build")
    return root / "build" / "libgpuproj_ort.so", root / "build" / "libgpuproj_torch.so"


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cuda_scaffold_runs_in_torch_on_the_gpu(cuda_scaffold, dtype):
    """The scaffold's CUDA compute function, run by the generic torch kernel on CUDA tensors (the
    library alone, loaded in a fresh process), against float64 numpy."""
    torch_lib = cuda_scaffold[1]
    if not opbridge.build_info().get("torch_version"):
        pytest.skip("opbridge was built without torch")
    out = subprocess.run([sys.executable, "-c", f"""
import numpy as np, torch, opbridge
torch.ops.load_library({str(torch_lib)!r})
rng = np.random.default_rng()
xd = torch.tensor(rng.standard_normal((37, 1000)), dtype=torch.{dtype}, device="cuda")
wd = torch.tensor(rng.standard_normal(1000), dtype=torch.{dtype}, device="cuda")
y = torch.ops.gpuproj.scaled_mul(xd, wd, 0.75)
assert y.device.type == "cuda" and y.dtype == xd.dtype, (y.device, y.dtype)
want = 0.75 * xd.cpu().double().numpy() * wd.cpu().double().numpy()
tol = {{"float32": 1e-6, "float64": 1e-14}}["{dtype}"] * np.abs(want).max()
np.testing.assert_allclose(y.cpu().double().numpy(), want, rtol=0, atol=tol)
print("ok")
"""], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1:] == ["ok"], out.stdout[-3000:] + out.stderr[-3000:]


@pytest.mark.cuda
def test_cuda_scaffold_runs_in_ort_cuda_provider(cuda_scaffold):
    """The same compute function through the generic ORT kernel on ORT's CUDA provider (no CPU
    fallback): float32 and float64 against float64 numpy."""
    import numpy as np
    import onnxruntime as ort
    from helpers.onnx_models import single_node_model

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
    rng = np.random.default_rng()
    for dtype, tol in ((np.float32, 1e-6), (np.float64, 1e-14)):
        m = single_node_model("ScaledMul", "com.example.gpuproj", [("x", dtype, ["N", 300]), ("weight", dtype, [300])],
                              {"alpha": -1.5})
        so = ort.SessionOptions()
        so.register_custom_ops_library(str(cuda_scaffold[0]))
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")  # the CUDA kernel or nothing
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CUDAExecutionProvider"])
        x, w = rng.standard_normal((50, 300)), rng.standard_normal(300)
        (y,) = sess.run(None, {"x": x.astype(dtype), "weight": w.astype(dtype)})
        want = -1.5 * x.astype(dtype).astype(np.float64) * w.astype(dtype).astype(np.float64)
        np.testing.assert_allclose(y.astype(np.float64), want, rtol=0, atol=tol * np.abs(want).max())
