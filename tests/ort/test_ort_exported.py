"""Models exported with torch (tests/helpers/exported_models.py), run on the installed onnxruntime.

Torch-free. scripts/ort_matrix.sh exports the models once with the dev environment and points
OPBRIDGE_EXPORTED_MODELS at them, so every onnxruntime in the matrix runs the same files; without
that variable the tests skip.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import opbridge
from opbridge._check import check

MODELS_DIR = os.environ.get("OPBRIDGE_EXPORTED_MODELS")
ORT_VERSION = tuple(int(p) for p in ort.__version__.split(".")[:2])
# What onnxruntime 1.17 loads: IR <= 9 and opset <= 20 (1.18 added IR 10 / opset 21).
ORT_117_LIMITS = (9, 20)

MODELS = sorted(Path(MODELS_DIR).glob("*.onnx")) if MODELS_DIR else []


@pytest.mark.skipif(not MODELS_DIR, reason="OPBRIDGE_EXPORTED_MODELS is not set (scripts/ort_matrix.sh sets it)")
def test_models_were_exported():
    assert MODELS, f"no .onnx files in {MODELS_DIR}"


@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_exported_model_runs_and_matches_torch(path):
    model = onnx.load(str(path))
    opset = {o.domain: o.version for o in model.opset_import}[""]
    if ORT_VERSION < (1, 18) and (model.ir_version > ORT_117_LIMITS[0] or opset > ORT_117_LIMITS[1]):
        pytest.skip(f"onnxruntime {ort.__version__} loads IR <= 9 / opset <= 20; this is IR {model.ir_version} "
                    f"opset {opset}")
    data = np.load(path.with_suffix(".npz"))
    custom = any(n.domain == opbridge.DOMAIN for n in model.graph.node)
    if custom:
        sess = opbridge.InferenceSession(str(path))
    else:  # standard lowering: stock onnxruntime, no library
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: data[f"input_{k}"] for k, i in enumerate(sess.get_inputs())}
    outputs = sess.run(None, feeds)
    atol = float(data["atol"]) if "atol" in data else 1e-5
    assert len(outputs) == len([k for k in data.files if k.startswith("expected_")])
    for k, y in enumerate(outputs):
        # NaN where torch has NaN (a singular matrix with on_singular="nan"), nowhere else.
        np.testing.assert_allclose(y, data[f"expected_{k}"], rtol=1e-4, atol=atol, equal_nan=True)
    # `opbridge check` agrees: every op provided, one run succeeds.
    report = check(path, out=io.StringIO())
    assert report.ok and not report.missing, report
