"""What adding an argument to an op costs: tests/fixtures/group_norm_alpha.patch adds ``alpha`` (a
float, default 1.0, scaling GroupNorm's output) and touches exactly the op's declaration, its
kernel's header, its CPU kernel and its CUDA kernel. Everything else -- the torch schema and its
fake kernel, autograd through the declared backward, both exporters' custom lowering, the ORT op
and its shape inference, opbridge._core -- follows from the declaration. The slow test builds the
patched tree and runs opbridge.testing.check_op on it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATCH = ROOT / "tests" / "fixtures" / "group_norm_alpha.patch"
# The four files an argument of an op is written in (before the generic adapters: 13).
TOUCHED = {
    "ops/group_norm/group_norm_decl.cpp",  # the declaration (and the kernels' arguments from a call)
    "ops/group_norm/group_norm.h",  # the kernel's own header (GroupNormParams)
    "ops/group_norm/group_norm_cpu.cpp",  # the CPU kernel
    "ops/group_norm/group_norm_kernel.cu",  # the CUDA kernel
}


def _git(*args: str, cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, **kw)


needs_git = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                               reason="needs git and a git checkout of the project")


@needs_git
def test_the_patch_touches_exactly_four_files_and_applies():
    numstat = _git("apply", "--numstat", str(PATCH), cwd=ROOT, check=True).stdout
    files = {line.split("\t")[2] for line in numstat.splitlines() if line.strip()}
    assert files == TOUCHED, numstat
    # It applies to the tree as it is: an op's code that moved would show here first.
    check = _git("apply", "--check", str(PATCH), cwd=ROOT)
    assert check.returncode == 0, check.stderr


def _copy_tree(dest: Path) -> None:
    listed = _git("ls-files", "-co", "--exclude-standard", "-z", cwd=ROOT, check=True).stdout
    for rel in listed.split("\0"):
        if not rel or rel.startswith("tests/fuzz/corpus"):
            continue
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


# Run in the patched build's Python: check_op on samples with alpha != 1 (and one with the
# default), a float64 reference written from the definition.
CHECK = r"""
import json, sys
import numpy as np
import torch
import opbridge.ops, opbridge.testing
from opbridge._op_library import opbridge_library

op = opbridge_library().ops["group_norm"]
assert [a.name for a in op.args][-1] == "alpha", op.args

def reference(x, num_groups, weight=None, bias=None, eps=1e-5, activation="none", alpha=1.0):
    x = x.numpy()
    n, c = x.shape[:2]
    g = x.reshape(n, num_groups, -1)
    y = ((g - g.mean(axis=2, keepdims=True)) / np.sqrt(g.var(axis=2, keepdims=True) + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * weight.numpy().reshape(shape)
    if bias is not None:
        y = y + bias.numpy().reshape(shape)
    if activation == "silu":
        y = y / (1 + np.exp(-y))
    return alpha * y

torch.manual_seed(int(sys.argv[1]))
samples = [
    (torch.randn(2, 6, 5, 4), 3, torch.randn(6), torch.randn(6), 1e-5, "none", 2.5),
    (torch.randn(3, 4, 7) * 3 + 1, 2, torch.rand(4) + 0.5, None, 1e-3, "silu", -0.75),
    (torch.randn(1, 8, 3), 4, None, torch.randn(8)),
]
report = opbridge.testing.check_op("opbridge::group_norm", reference, samples, dtypes=[torch.float32, torch.float64],
                                   lowerings=["custom"], export_samples=len(samples), raise_on_failure=False)
# Also the kernel on arrays, called as opbridge._core.group_norm with alpha by name.
x = np.random.default_rng(1).standard_normal((2, 4, 3, 3))
got = opbridge._core.group_norm(x, 2, alpha=3.0)
want = reference(torch.from_numpy(x), 2, alpha=3.0)
core_ok = bool(np.allclose(got, want, rtol=1e-12, atol=1e-12))
print(json.dumps({"checks": [[c.name, c.status, c.detail] for c in report.checks], "core_ok": core_ok,
                  "report": str(report)}))
"""


@pytest.mark.slow
@pytest.mark.torch
@needs_git
def test_the_patched_tree_builds_and_passes_check_op(tmp_path):
    src = tmp_path / "src"
    _copy_tree(src)
    applied = _git("apply", str(PATCH), cwd=src)
    assert applied.returncode == 0, applied.stderr
    dist, site = tmp_path / "dist", tmp_path / "site"
    conan_home = ROOT / ".conan-home"
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(dist), str(src),
           f"-Cbuild-dir={tmp_path / 'build'}"]
    if conan_home.is_dir():
        cmd.append(f"-Ccmake.define.OPBRIDGE_CONAN_HOME={conan_home}")  # the dependencies' cache of this checkout
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    wheel = next(dist.glob("opbridge-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    env = dict(os.environ, PYTHONPATH=str(site))
    run = subprocess.run([sys.executable, "-c", CHECK, "7"], capture_output=True, text=True, timeout=3600, env=env,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["core_ok"]
    checks = {name: (status, detail) for name, status, detail in result["checks"]}
    failed = {name: detail for name, (status, detail) in checks.items() if status == "FAIL"}
    # Second-order gradients go through GroupNorm's differentiable backward, a composite of torch
    # ops written in Python before alpha existed: for alpha != 1 it refuses clearly (a 5th file
    # would teach it alpha); everything else passes with alpha.
    assert set(failed) <= {"gradgradcheck, sample 0", "gradgradcheck, sample 1"}, result["report"]
    for detail in failed.values():
        assert "NotImplementedError" in detail and "alpha" in detail, result["report"]
    for name in ("forward float32, sample 0", "forward float64, sample 1", "gradcheck, sample 0",
                 "gradcheck, sample 1", "gradgradcheck, sample 2", "torch.library.opcheck float32, sample 1",
                 "arrays (opbridge._core) float64, sample 1",
                 "dynamo export, lowering custom, float32, sample 1",
                 "torchscript export, lowering custom, float64, sample 0",
                 "ONNX Runtime CPU vs torch, dynamo export, lowering custom, float32, sample 0",
                 "ONNX Runtime CPU vs torch, torchscript export, lowering custom, float64, sample 1"):
        assert checks.get(name, ("missing",))[0] == "ok", (name, result["report"])
