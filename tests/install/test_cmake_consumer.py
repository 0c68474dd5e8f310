"""The installed CMake package, used from C++ (tests/install/cmake_consumer/): find_package(opbridge),
ONNX Runtime C++ programs that register opbridge's ops by path and by linking opbridge::ort, and
the framework-free kernels of opbridge::kernels. The expected values are float64 results of
tests/install/cmake_consumer/eigen_reference.cpp (Eigen's LU for Inverse, its array expressions for
GroupNorm: nothing of opbridge); the C++ programs only load, run and write .npy files."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import opbridge
from helpers.cmake_helpers import REPO, build, configure, run
from helpers.onnx_models import single_node_model

torch = pytest.importorskip("torch", reason="the models are exported from torch")
import opbridge.onnx  # noqa: E402
import opbridge.ops  # noqa: E402

HAS_INVERSE = hasattr(torch.ops.opbridge, "inverse")
NO_INVERSE = "torch.ops.opbridge.inverse is not in this build (the Inverse op is not part of it yet)"

# A CMake project that only looks the package up and reports what it found.
PROBE = """
cmake_minimum_required(VERSION 3.21)
project(probe LANGUAGES NONE)
find_package(opbridge ${REQ} CONFIG ${ARGS})
set(out "found=${opbridge_FOUND}\\nversion=${opbridge_VERSION}\\ndir=${opbridge_DIR}\\n")
if(opbridge_FOUND)
  foreach(t ort kernels ort_adapter onnxruntime_headers torch_adapter torch)
    if(TARGET opbridge::${t})
      string(APPEND out "target.${t}=1\\n")
    endif()
  endforeach()
  get_target_property(loc opbridge::ort LOCATION)
  get_target_property(inc opbridge::kernels INTERFACE_INCLUDE_DIRECTORIES)
  get_target_property(ort_inc opbridge::onnxruntime_headers INTERFACE_INCLUDE_DIRECTORIES)
  string(APPEND out "ort=${loc}\\ninclude=${inc}\\nort_include=${ort_inc}\\n"
                    "ort_api=${opbridge_ORT_API_VERSION}\\ntorch_version=${opbridge_TORCH_VERSION}\\n")
endif()
file(WRITE "${CMAKE_BINARY_DIR}/probe.txt" "${out}")
"""


def probe(tmp_path: Path, defines: dict, name: str = "probe") -> dict:
    src = tmp_path / f"{name}-src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(PROBE)
    configure(src, tmp_path / f"{name}-build", defines)
    text = (tmp_path / f"{name}-build" / "probe.txt").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def package_dir() -> Path:
    return Path(opbridge.cmake_dir()).parents[2]


# ---- finding the package -------------------------------------------------------------------
def _route(route: str) -> dict:
    if route == "cmake_dir":
        return {"opbridge_DIR": opbridge.cmake_dir()}
    if route == "cli":
        p = subprocess.run([sys.executable, "-m", "opbridge", "--cmake-dir"], capture_output=True, text=True,
                           check=True)
        return {"opbridge_DIR": p.stdout.strip()}
    # scikit-build-core's way: the cmake.prefix entry point's package folder on CMAKE_PREFIX_PATH.
    (ep,) = [e for e in importlib.metadata.entry_points(group="cmake.prefix") if e.name == "opbridge"]
    prefix = Path(os.fspath(importlib.resources.files(ep.load())))
    return {"CMAKE_PREFIX_PATH": prefix, "CMAKE_FIND_USE_PACKAGE_REGISTRY": "OFF"}


@pytest.mark.parametrize("route", ["cmake_dir", "cli", "cmake.prefix entry point"])
def test_find_package(tmp_path, route):
    found = probe(tmp_path, _route(route))
    assert found["found"] == "1"
    assert found["version"] == opbridge.__version__
    assert Path(found["dir"]).resolve() == Path(opbridge.cmake_dir()).resolve()
    for t in ("ort", "kernels", "ort_adapter", "onnxruntime_headers"):
        assert found.get(f"target.{t}") == "1", t
    assert Path(found["ort"]).resolve() == Path(opbridge.get_library_path()).resolve()
    ort_include = Path(found["ort_include"])
    assert (ort_include / "onnxruntime_cxx_api.h").is_file() and (ort_include / "LICENSE").is_file()
    # The headers shipped are the ones the library was built with.
    assert found["ort_api"] == str(opbridge.build_info()["ort_api_version"])


def test_version_compatibility(tmp_path):
    major, minor, *_ = (int(p) for p in opbridge.__version__.split("."))
    cases = {
        opbridge.__version__: "1",
        f"{major}.{minor}": "1",
        f"{major}.{minor + 1}": "0",  # SameMinorVersion: a newer minor is not this one
        f"{major + 1}.0": "0",
    }
    if minor > 0:
        cases[f"{major}.{minor - 1}"] = "0"
    for i, (req, expected) in enumerate(cases.items()):
        found = probe(tmp_path, {"opbridge_DIR": opbridge.cmake_dir(), "REQ": req}, name=f"v{i}")
        assert found["found"] == expected, f"find_package(opbridge {req}) with opbridge {opbridge.__version__}"


def test_relocatable(tmp_path):
    # A copy of the package elsewhere (as a wheel installed to another prefix) must find itself.
    copy = tmp_path / "elsewhere" / "opbridge"
    shutil.copytree(package_dir(), copy, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    found = probe(tmp_path, {"opbridge_DIR": copy / "share" / "cmake" / "opbridge"})
    assert found["found"] == "1"
    assert Path(found["ort"]) == copy / "libopbridge_ort.so"
    assert found["include"] == str(copy / "include")
    assert Path(found["ort_include"]) == copy / "include" / "onnxruntime"


@pytest.mark.skipif(not opbridge.build_info().get("torch_version"), reason="opbridge was built without torch")
def test_torch_component(tmp_path):
    found = probe(tmp_path, {"opbridge_DIR": opbridge.cmake_dir(), "ARGS": "REQUIRED;COMPONENTS;torch"})
    assert found["found"] == "1"
    assert found.get("target.torch_adapter") == "1" and found.get("target.torch") == "1"
    assert found["torch_version"] == torch.__version__


# ---- the C++ programs ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def consumer(tmp_path_factory) -> Path:
    """tests/install/cmake_consumer, configured against the installed package and built."""
    build_dir = tmp_path_factory.mktemp("cmake_consumer")
    # OPBRIDGE_SOURCE_DIR: also build eigen_reference (Eigen through the repo's conan setup).
    configure(REPO / "tests" / "install" / "cmake_consumer", build_dir,
              {"opbridge_DIR": opbridge.cmake_dir(), "OPBRIDGE_SOURCE_DIR": REPO})
    build(build_dir)
    return build_dir


def eigen_reference(consumer: Path, tmp_path: Path, op: str, *arrays: np.ndarray, args: tuple = ()) -> np.ndarray:
    """The float64 result of tests/install/cmake_consumer/eigen_reference for `op` on `arrays`."""
    paths = []
    for i, a in enumerate(arrays):
        paths.append(tmp_path / f"ref_in{i}.npy")
        np.save(paths[-1], np.ascontiguousarray(a, dtype=np.float64))
    out = tmp_path / "ref_out.npy"
    np.save(out, np.full((1,), np.nan))
    run([consumer / "eigen_reference", op, *paths, *args, out])
    return np.load(out)


def run_program(exe: Path, args: list, out_dir: Path, n_out: int = 1, expect_ok: bool = True):
    """Runs a program that writes <out_dir>/<i>.npy; the files are poisoned first (NaN), so a
    program that writes nothing cannot pass."""
    for i in range(n_out):
        np.save(out_dir / f"{i}.npy", np.full((1,), np.nan))
    p = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=120)
    if not expect_ok:
        return p
    assert p.returncode == 0, f"{exe.name} failed ({p.returncode}):\n{p.stderr}"
    return [np.load(out_dir / f"{i}.npy") for i in range(n_out)]


class GroupNormModel(torch.nn.Module):
    def __init__(self, channels: int, groups: int, rng: np.random.Generator, dtype: torch.dtype):
        super().__init__()
        self.groups = groups
        self.weight = torch.nn.Parameter(torch.from_numpy(rng.standard_normal(channels)).to(dtype))
        self.bias = torch.nn.Parameter(torch.from_numpy(rng.standard_normal(channels)).to(dtype))

    def forward(self, x):
        return opbridge.ops.group_norm(x * 2.0 + 1.0, self.groups, self.weight, self.bias, 1e-5)


class InverseModel(torch.nn.Module):
    def forward(self, x):
        inverse = getattr(opbridge.ops, "inverse", None) or torch.ops.opbridge.inverse
        return inverse(x) + 1.0


def make_case(op: str, dtype: torch.dtype, rng: np.random.Generator, tmp_path: Path, consumer: Path):
    """(model path, input, expected float64 output computed by eigen_reference)."""
    if op == "group_norm":
        model = GroupNormModel(6, 3, rng, dtype)
        x = torch.from_numpy(rng.standard_normal((2, 6, 5, 4)) * 3 + 0.5).to(dtype)
        # The model's own arithmetic around the op, in float64 (x * 2 + 1 is exact there).
        expected = eigen_reference(consumer, tmp_path, "group_norm", x.double().numpy() * 2.0 + 1.0,
                                   model.weight.detach().double().numpy(), model.bias.detach().double().numpy(),
                                   args=(3, 1e-5))
    else:
        model = InverseModel()
        n = 5
        # Diagonally dominant: well conditioned, so float32 results are accurate to ~1e-6.
        a = rng.standard_normal((3, n, n)) + n * np.eye(n)
        x = torch.from_numpy(a).to(dtype)
        expected = eigen_reference(consumer, tmp_path, "inverse", x.double().numpy()) + 1.0
    path = tmp_path / f"{op}.onnx"
    model.eval()
    with torch.no_grad():
        opbridge.onnx.export(model, (x,), path, dynamo=True)
    assert any(n.domain == opbridge.DOMAIN for n in onnx.load(path).graph.node), "no ai.opbridge node exported"
    return path, x.numpy(), expected


OPS = ["group_norm", pytest.param("inverse", marks=pytest.mark.skipif(not HAS_INVERSE, reason=NO_INVERSE))]
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float64: dict(rtol=1e-10, atol=1e-10)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("op", OPS)
def test_cpp_program_runs_model(consumer, tmp_path, rng, op, dtype):
    model, x, expected = make_case(op, dtype, rng, tmp_path, consumer)
    np.save(tmp_path / "x.npy", x)
    # RegisterCustomOpsLibrary by path, and RegisterCustomOps of the linked opbridge::ort.
    for exe, reg in ((consumer / "opbridge_run", ["--library", opbridge.get_library_path()]),
                     (consumer / "opbridge_run_linked", ["--linked"])):
        (y,) = run_program(exe, [*reg, model, tmp_path, tmp_path / "x.npy"], tmp_path)
        assert y.dtype == x.dtype and y.shape == expected.shape, exe.name
        np.testing.assert_allclose(y, expected, **TOL[dtype], err_msg=exe.name)


def test_cpp_program_needs_registration(consumer, tmp_path, rng):
    model, x, _ = make_case("group_norm", torch.float32, rng, tmp_path, consumer)
    np.save(tmp_path / "x.npy", x)
    p = run_program(consumer / "opbridge_run", [model, tmp_path, tmp_path / "x.npy"], tmp_path, expect_ok=False)
    assert p.returncode == 1 and "GroupNorm" in p.stderr


def test_cpp_program_reports_op_errors(consumer, tmp_path, rng):
    # num_groups = 3 does not divide C = 4: an ORT error status from the op, not a crash.
    m = single_node_model("GroupNorm", opbridge.DOMAIN, [("X", np.float32, [2, 4, 3]), None, None], {"num_groups": 3})
    onnx.save(m, tmp_path / "bad.onnx")
    np.save(tmp_path / "x.npy", rng.standard_normal((2, 4, 3)).astype(np.float32))
    for exe, reg in ((consumer / "opbridge_run", ["--library", opbridge.get_library_path()]),
                     (consumer / "opbridge_run_linked", ["--linked"])):
        p = run_program(exe, [*reg, tmp_path / "bad.onnx", tmp_path, tmp_path / "x.npy"], tmp_path, expect_ok=False)
        assert p.returncode == 1, p.stderr
        assert "ai.opbridge::GroupNorm" in p.stderr and "num_groups must divide" in p.stderr


def test_kernels_without_any_framework(consumer, tmp_path, rng):
    x = (rng.standard_normal((3, 8, 7)) * 4 - 2).astype(np.float32)
    w = rng.standard_normal(8).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    for name, a in (("x", x), ("w", w), ("b", b)):
        np.save(tmp_path / f"{name}.npy", a)
    np.save(tmp_path / "0.npy", np.full((1,), np.nan))
    run([consumer / "group_norm_direct", tmp_path / "x.npy", tmp_path / "w.npy", tmp_path / "b.npy", 4, 1e-5,
         tmp_path / "0.npy"])
    expected = eigen_reference(consumer, tmp_path, "group_norm", x, w, b, args=(4, 1e-5))
    np.testing.assert_allclose(np.load(tmp_path / "0.npy"), expected, rtol=1e-4, atol=1e-5)


# (shape, groups, channels_last): [N, C, S] groups; [N, S, C] samples that are one task each
# (N >= 8), and samples cut into tiles (3 MiB of float32, beyond the cache budget), where the
# range holding a sample's first tile writes its statistics; an empty x.
STATS_CASES = [
    ((3, 8, 5, 7), 4, False),
    ((9, 16, 6, 5), 8, True),
    ((2, 96, 64, 128), 32, True),
    ((3, 4, 0), 2, False),
]


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=["float32", "float64", "float16"])
@pytest.mark.parametrize("shape,groups,channels_last", STATS_CASES, ids=[f"{s}-G{g}-cl{int(c)}" for s, g, c in STATS_CASES])
def test_statistics_outputs(consumer, tmp_path, rng, isa, dtype, shape, groups, channels_last):
    # The kernel's optional per-group outputs (the C++ API's mean / rstd, which neither torch nor ORT
    # asks for): each group's mean and 1 / sqrt(var + eps), in the accumulation type, against
    # float64 statistics of the same input; y as without them. Each instruction-set variant
    # (OPBRIDGE_CPU_ISA caps the program's level: where this CPU lacks a variant, its best one runs).
    x = (rng.standard_normal(shape) * 2.0 + 1.5).astype(dtype)
    c = shape[1]
    w, b = rng.standard_normal(c).astype(dtype), rng.standard_normal(c).astype(dtype)
    eps = float(rng.uniform(1e-6, 1e-3))
    xin = np.ascontiguousarray(np.moveaxis(x, 1, -1)) if channels_last else x
    for name, a in (("x", xin), ("w", w), ("b", b)):
        np.save(tmp_path / f"{name}.npy", a)
    env = dict(os.environ, OPBRIDGE_CPU_ISA=isa)
    args = [tmp_path / "x.npy", tmp_path / "w.npy", tmp_path / "b.npy", groups, repr(eps)]
    outs = []
    for stats in (True, False):
        for i in range(3):
            np.save(tmp_path / f"{i}.npy", np.full((1,), np.nan))
        extra = [tmp_path / "1.npy", tmp_path / "2.npy"] + (["channels_last"] if channels_last else []) if stats else []
        if not stats and channels_last:
            continue  # without statistics the program has no layout argument
        p = subprocess.run([str(consumer / "group_norm_direct"), *map(str, args), str(tmp_path / "0.npy"),
                            *map(str, extra)], capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr
        outs.append([np.load(tmp_path / f"{i}.npy") for i in range(3 if stats else 1)])
    y, mean, rstd = outs[0]
    if not channels_last:
        np.testing.assert_array_equal(y, outs[1][0])
    acc = np.float64 if dtype == np.float64 else np.float32
    assert mean.dtype == acc and rstd.dtype == acc and mean.shape == rstd.shape == (shape[0], groups)
    g = x.astype(np.float64).reshape(shape[0], groups, -1)
    if g.shape[2] == 0:
        assert (mean == 0).all() and (rstd == 0).all()
        return
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(mean, g.mean(axis=2), rtol=0, atol=tol * 4)
    np.testing.assert_allclose(rstd, 1.0 / np.sqrt(g.var(axis=2) + eps), rtol=tol * 4, atol=0)


# (shape, groups): contiguous channels of 63 elements (the short-channel sums) with C not a
# multiple of any vector width; a channels-last sample of two tiles, so that ranges split samples.
BACKWARD_DIRECT_CASES = [((3, 40, 9, 7), 4), ((2, 64, 40, 40), 8)]


@pytest.mark.parametrize("ranges", [1, 3])
@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("shape,groups", BACKWARD_DIRECT_CASES, ids=[str(c[0]) for c in BACKWARD_DIRECT_CASES])
def test_backward_kernel_without_any_framework(consumer, tmp_path, rng, shape, groups, layout, activation, ranges):
    # group_norm_backward_cpu from C++ with and without dx: dx = nullptr (dweight and dbias only)
    # is a path of the C++ API that neither torch nor ORT takes; so is dx computed in place over dy
    # or over x, which the API allows.
    from helpers.reference import group_norm_backward as ref_backward

    x = (rng.standard_normal(shape) * 1.7 + 0.3).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[1]).astype(np.float32)
    b = (rng.standard_normal(shape[1]) * 0.5).astype(np.float32)
    to_file = (lambda a: np.ascontiguousarray(np.moveaxis(a, 1, -1))) if layout == "nhwc" else (lambda a: a)
    for name, a in (("x", to_file(x)), ("dy", to_file(dy)), ("w", w), ("b", b)):
        np.save(tmp_path / f"{name}.npy", a)
    dx, dw, db, dw_only, db_only, dx_over_dy, dx_over_x, dx_aligned = run_program(
        consumer / "group_norm_backward_direct",
        [tmp_path / "x.npy", tmp_path / "w.npy", tmp_path / "b.npy", tmp_path / "dy.npy", groups, 1e-5, layout,
         activation, ranges, tmp_path], tmp_path, n_out=8)
    # In place, the same dx bit for bit as from the same x (at the same alignment) not in place.
    np.testing.assert_array_equal(dx_over_dy, dx)
    np.testing.assert_array_equal(dx_over_x, dx_aligned)
    if layout == "nhwc":
        dx = np.moveaxis(dx, -1, 1)
    want = ref_backward(x, groups, w, dy, 1e-5, bias=b, activation=activation)
    for got, wnt in zip((dx, dw, db), want):
        scale = max(1.0, float(np.abs(wnt).max()))
        np.testing.assert_allclose(got.astype(np.float64), wnt, rtol=0, atol=2e-5 * scale)
    # Without dx, the same dweight and dbias, bit for bit (the same sums in the same order).
    np.testing.assert_array_equal(dw_only, dw)
    np.testing.assert_array_equal(db_only, db)


@pytest.mark.cuda
@pytest.mark.parametrize("op", OPS)
def test_cpp_program_runs_model_on_cuda(consumer, tmp_path, rng, op):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
    model, x, expected = make_case(op, torch.float32, rng, tmp_path, consumer)
    np.save(tmp_path / "x.npy", x)
    # --cuda disables the CPU fallback: the session fails unless our ops have CUDA kernels.
    (y,) = run_program(consumer / "opbridge_run", ["--cuda", "--library", opbridge.get_library_path(), model,
                                                    tmp_path, tmp_path / "x.npy"], tmp_path)
    np.testing.assert_allclose(y, expected, **TOL[torch.float32])


def test_eigen_reference_agrees_with_numpy(consumer, tmp_path, rng):
    # The reference the tests above trust, checked once against numpy's float64 (LAPACK) results.
    a = rng.standard_normal((2, 7, 7)) + 7 * np.eye(7)
    np.testing.assert_allclose(eigen_reference(consumer, tmp_path, "inverse", a), np.linalg.inv(a), rtol=1e-12,
                               atol=1e-12)
    x = rng.standard_normal((3, 8, 5, 2)) * 4 - 1
    w, b = rng.standard_normal(8), rng.standard_normal(8)
    g = x.reshape(3, 2, -1)
    xhat = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-3)).reshape(x.shape)
    expected = xhat * w[:, None, None] + b[:, None, None]
    np.testing.assert_allclose(eigen_reference(consumer, tmp_path, "group_norm", x, w, b, args=(2, 1e-3)), expected,
                               rtol=1e-12, atol=1e-12)
