"""AOTInductor packages (.pt2) that call our ops and a scaffolded user op: compiled with a dynamic
batch, run from Python (torch._inductor.aoti_load_package) and from C++ with no Python
(examples/aoti, built against the installed CMake package and libtorch), equal to eager; and
`opbridge pt2`, which names the op libraries a package needs."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import opbridge  # noqa: E402
import opbridge.ops  # noqa: E402
from helpers.cmake_helpers import REPO, build, configure  # noqa: E402

pytestmark = pytest.mark.torch

LEVELS = [(6, 5), (3, 3)]  # MSDA: two levels, S = 39


def _user_op():
    """(namespace, torch library) of an installed op package made by `opbridge new-op scaled_mul`
    (CI installs one), or None."""
    from opbridge._discovery import discover
    from opbridge._op_library import libraries

    discover()
    for lib in libraries()[1:]:
        if lib.torch_path and "ScaledMul" in {op.onnx_type for op in lib.ops.values()}:
            return lib.namespace, lib.torch_path
    return None


class Model(torch.nn.Module):
    """A conv, GroupNorm+SiLU, Inverse and MultiScaleDeformableAttention, and the user's op."""

    def __init__(self, user_ns):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.w = torch.nn.Parameter(torch.randn(8))
        self.b = torch.nn.Parameter(torch.randn(8))
        shapes = torch.tensor(LEVELS, dtype=torch.int64)
        areas = shapes[:, 0] * shapes[:, 1]
        self.register_buffer("shapes", shapes)
        self.register_buffer("starts", torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]]))
        self.user_ns = user_ns
        self.uw = torch.nn.Parameter(torch.randn(6))

    def forward(self, x, a, value, loc, attn, u):
        outs = [opbridge.ops.group_norm(self.conv(x), 4, self.w, self.b, 1e-5, "silu"),
                opbridge.ops.inverse(a),
                opbridge.ops.ms_deform_attn(value, self.shapes, self.starts, loc, attn)]
        if self.user_ns is not None:
            outs.append(getattr(torch.ops, self.user_ns).scaled_mul(u, self.uw, 0.5))
        return tuple(outs)


def _inputs(rng, batch):
    s = sum(h * w for h, w in LEVELS)
    f = lambda *shape: torch.from_numpy(rng.standard_normal(shape)).float()  # noqa: E731
    a = f(batch, 4, 4) + 4 * torch.eye(4)
    loc = torch.from_numpy(rng.uniform(-0.1, 1.1, (batch, 7, 2, len(LEVELS), 3, 2))).float()
    attn = torch.from_numpy(rng.uniform(0, 1, (batch, 7, 2, len(LEVELS), 3))).float()
    return (f(batch, 3, 10, 10), a, f(batch, s, 2, 4), loc, attn, f(batch, 6))


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    user = _user_op()
    if user is not None:
        torch.ops.load_library(user[1])
    torch.manual_seed(0)
    model = Model(user[0] if user else None).eval()
    rng = np.random.default_rng(0)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, _inputs(rng, 2), dynamic_shapes=tuple({0: batch} for _ in range(6)))
    path = tmp_path_factory.mktemp("aoti") / "model.pt2"
    torch._inductor.aoti_compile_and_package(ep, package_path=str(path))
    return path, model, user


def _close(got, want):
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g.detach().double().numpy(), w.detach().double().numpy(), rtol=0,
                                   atol=1e-5 * max(1.0, float(w.abs().max())))


@pytest.mark.parametrize("batch", [2, 5])
def test_package_runs_in_python_like_eager(package, rng, batch):
    path, model, user = package
    loaded = torch._inductor.aoti_load_package(str(path))
    inputs = _inputs(rng, batch)
    with torch.no_grad():
        want = model(*inputs)
    got = loaded(*inputs)
    assert len(got) == len(want) == (4 if user else 3)
    _close(got, want)


def _write(path, tensors):
    with open(path, "wb") as f:
        for t in tensors:
            t = t.detach().float().contiguous()
            f.write(np.array([t.dim(), *t.shape], dtype=np.int64).tobytes())
            f.write(t.numpy().tobytes())


def _read(path):
    data, out, pos = open(path, "rb").read(), [], 0
    while pos < len(data):
        ndim = int(np.frombuffer(data, np.int64, 1, pos)[0])
        dims = tuple(int(d) for d in np.frombuffer(data, np.int64, ndim, pos + 8))
        pos += 8 * (ndim + 1)
        n = int(np.prod(dims))
        out.append(torch.from_numpy(np.frombuffer(data, np.float32, n, pos).reshape(dims).copy()))
        pos += 4 * n
    return out


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    """examples/aoti built against the installed opbridge and this Python's libtorch."""
    build_dir = tmp_path_factory.mktemp("aoti_build")
    configure(REPO / "examples" / "aoti", build_dir, {"CMAKE_PREFIX_PATH": torch.utils.cmake_prefix_path,
                                                      "opbridge_DIR": opbridge.cmake_dir()})
    build(build_dir)
    return build_dir / "run_pt2"


@pytest.mark.parametrize("batch", [3])
def test_package_runs_in_cpp_without_python_like_eager(package, runner, tmp_path, rng, batch):
    path, model, user = package
    inputs = _inputs(rng, batch)
    _write(tmp_path / "in.bin", inputs)
    libs = [user[1]] if user else []
    out = subprocess.run([str(runner), str(path), str(tmp_path / "in.bin"), str(tmp_path / "out.bin"), *libs],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    with torch.no_grad():
        want = model(*inputs)
    got = _read(tmp_path / "out.bin")
    assert len(got) == len(want) == (4 if user else 3)
    _close(got, want)


def test_cpp_loader_names_a_library_that_does_not_load(package, runner, tmp_path, rng):
    path, _, _ = package
    _write(tmp_path / "in.bin", _inputs(rng, 1))
    out = subprocess.run([str(runner), str(path), str(tmp_path / "in.bin"), str(tmp_path / "out.bin"),
                          str(tmp_path / "libmissing_torch.so")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert "could not load" in out.stderr and "libmissing_torch.so" in out.stderr, out.stderr


def test_pt2_command_names_the_libraries(package):
    path, _, user = package
    out = subprocess.run([sys.executable, "-m", "opbridge", "pt2", str(path), "--json"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "docs" / "schemas" / "pt2.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(report)  # docs/cli.md
    want = {"opbridge::group_norm", "opbridge::inverse", "opbridge::ms_deform_attn"}
    if user:
        want.add(f"{user[0]}::scaled_mul")
    assert set(report["ops"]) == want and report["loads"] is True and report["problems"] == []
    libs = subprocess.run([sys.executable, "-m", "opbridge", "pt2", str(path), "--libraries"], capture_output=True,
                          text=True, timeout=300).stdout.split()
    assert libs[0] == opbridge._library.torch_library_path()
    assert libs[1:] == ([user[1]] if user else [])


def test_pt2_command_on_unknown_ops_and_bad_files(tmp_path):
    pkg = tmp_path / "other.pt2"
    node = {"name": "buf0", "node": {"target": "nosuchns::frob", "inputs": [], "outputs": []}}
    with zipfile.ZipFile(pkg, "w") as z:
        z.writestr("other/data/aotinductor/model/x.wrapper.json", json.dumps({"nodes": [node]}))
        z.writestr("other/data/aotinductor/model/x.wrapper_metadata.json", "{}")
    out = subprocess.run([sys.executable, "-m", "opbridge", "pt2", str(pkg)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1 and "nosuchns::frob" in out.stdout and "nosuchns" in out.stdout, out.stdout
    bad = tmp_path / "notazip.pt2"
    bad.write_bytes(b"\x00" * 64)
    out = subprocess.run([sys.executable, "-m", "opbridge", "pt2", str(bad)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and "notazip.pt2" in out.stderr and "not an AOTInductor package" in out.stderr
