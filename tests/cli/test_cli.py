"""The opbridge command line."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "opbridge", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def test_info():
    r = _run("info")
    assert r.returncode == 0, r.stderr
    import opbridge

    assert opbridge.get_library_path() in r.stdout
    assert "ai.opbridge" in r.stdout


@pytest.mark.torch
def test_demo(tmp_path):
    pytest.importorskip("torch")
    r = _run("demo", "--out-dir", str(tmp_path / "out"), "--repeats", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    rows = {l.split()[0]: l.split() for l in lines if len(l.split()) == 6 and l.split()[0] in ("dynamo", "torchscript")}
    assert set(rows) == {"dynamo", "torchscript"}
    for exporter, row in rows.items():
        assert float(row[2]) < 1e-5, f"{exporter}: max abs error {row[2]}"
    assert (tmp_path / "out" / "small_convnet_dynamo.onnx").is_file()
    assert (tmp_path / "out" / "small_convnet_torchscript.onnx").is_file()
