"""`opbridge optimize` on files exported by optimum itself (`optimum-onnx`, the exporter users run for
RT-DETR, RT-DETRv2 and D-FINE; optimum has no export config for the other DETR-family models).
optimum-onnx 0.1.0 needs transformers < 4.58 and the suite pins 5.x, so the models are built and
exported in a venv of their own (created once under $OPBRIDGE_OPTIMUM_VENV, default
$HOME/.cache/opbridge-optimum/venv-<torch version>, with this torch release, optimum-onnx and
onnxruntime) by optimum_export.py, which also computes the torch model's float64 outputs there. Here: every
deformable attention rewritten, no GridSample left, optimize's own check against the original in
ONNX Runtime passed, and the rewritten file against torch in float64 at two sizes of the dynamic
batch and image. Slow: about 1.5 minutes to make the venv the first time, 20 s of exports."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")

import opbridge  # noqa: E402
from opbridge._optimize import optimize  # noqa: E402
from opbridge.onnx import _msda_rules  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

FAMILIES = ["rt_detr", "rt_detr_v2", "d_fine"]
OPTIMUM = "optimum-onnx==0.1.0"
HERE = Path(__file__).resolve().parent


def _venv() -> Path:
    release = torch.__version__.split("+")[0]
    default = Path.home() / ".cache" / "opbridge-optimum" / f"venv-{release}"
    venv = Path(os.environ.get("OPBRIDGE_OPTIMUM_VENV", default))
    python, done = venv / "bin" / "python", venv / "opbridge-ready"
    if done.exists():
        return python
    # optimum's export fixes dynamic axes with onnxruntime: the release this suite runs, where there is one.
    try:
        import onnxruntime

        ort = f"onnxruntime=={onnxruntime.__version__}"
    except ImportError:
        ort = "onnxruntime"
    steps = [[sys.executable, "-m", "venv", "--clear", str(venv)],
             [str(python), "-m", "pip", "install", "-q", f"torch=={release}", OPTIMUM, ort]]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            import shutil

            shutil.rmtree(venv, ignore_errors=True)
            pytest.skip(f"could not make the optimum venv ({' '.join(cmd[-3:])}): {r.stderr.strip()[-400:]}")
    done.write_text(" ".join(steps[1][5:]) + "\n")
    return python


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    python = _venv()
    out = tmp_path_factory.mktemp("optimum")
    r = subprocess.run([str(python), str(HERE / "optimum_export.py"), str(out), *FAMILIES],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return out


def _count(path: str, op_type: str, domain: str = "") -> int:
    return sum(1 for n in onnx.load(path).graph.node if n.op_type == op_type and n.domain == domain)


@pytest.mark.parametrize("family", FAMILIES)
def test_optimum_export_rewritten(exported, family, tmp_path):
    folder = exported / family
    meta = json.loads((folder / "meta.json").read_text())
    src, dst = str(folder / "model.onnx"), str(tmp_path / "model.opbridge.onnx")
    inputs = onnx.load(src).graph.input
    assert [i.name for i in inputs] == ["pixel_values"]
    dims = [d.dim_param for d in inputs[0].type.tensor_type.shape.dim]
    assert dims[0] and dims[2] and dims[3], f"optimum's export is not dynamic in batch and image: {dims}"
    assert _count(src, "GridSample") > 0

    out = io.StringIO()
    # optimize's check: the original and the rewritten file in ORT, at another batch and image
    # than the default of 2 for every symbolic dim (an image that small does not run).
    report = optimize(src, dst, out=out, dims={dims[0]: 2, dims[2]: 256, dims[3]: 352})
    text = out.getvalue()
    assert report.ok, text
    assert report.result.counts.get(_msda_rules.LABEL) == meta["modules"] > 0, text
    assert _count(dst, "GridSample") == 0, text
    assert _count(dst, _msda_rules.OP_TYPE, _msda_rules.DOMAIN) == meta["modules"]

    ref = np.load(folder / "reference.npz")
    session = opbridge.InferenceSession(dst)
    for i in range(2):
        got = session.run(None, {"pixel_values": ref[f"x{i}"].astype(np.float32)})
        for name, g in zip(("logits", "pred_boxes"), got):
            want = ref[f"{name}{i}"]
            assert g.shape == want.shape, (name, i)
            err = float(np.max(np.abs(g - want))) / max(1.0, float(np.max(np.abs(want))))
            assert err <= 2e-4, f"{family} {name} at input {i}: normalized error {err:.3g} ({meta})"
