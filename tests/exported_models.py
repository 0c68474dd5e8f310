"""Models exported by opbridge.onnx.export, saved with inputs and torch's outputs, so that
environments without torch (the onnxruntime version matrix) can run real exported models.

    python tests/exported_models.py OUT_DIR      # needs torch; writes NAME.onnx + NAME.npz

tests/test_ort_exported.py runs them when OPBRIDGE_EXPORTED_MODELS names that directory.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

# (exporter, opset, lowering): both lowerings and exporters at the oldest opset, opset 20 (the
# newest ONNX Runtime 1.17 loads) and GroupNormalization-21.
CASES = [
    ("dynamo", 17, "custom"), ("dynamo", 17, "standard"),
    ("torchscript", 17, "custom"), ("torchscript", 17, "standard"),
    ("dynamo", 20, "custom"), ("torchscript", 20, "standard"),
    ("dynamo", 21, "custom"), ("dynamo", 21, "standard"),
]


def _model():
    import torch

    import opbridge.nn

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        opbridge.nn.GroupNorm(4, 8),
        torch.nn.ReLU(),
        opbridge.nn.GroupNorm(2, 8, affine=False),
    ).eval()
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-0.5, 0.5)
    return model


def export_all(out_dir: str | Path) -> list[Path]:
    import torch

    import opbridge.onnx

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = _model()
    x = np.random.default_rng(0).standard_normal((3, 3, 6, 7)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    written = []
    for exporter, opset, lowering in CASES:
        name = f"{exporter}_opset{opset}_{lowering}"
        opbridge.onnx.export(model, (torch.randn(2, 3, 6, 7),), out / f"{name}.onnx", dynamo=exporter == "dynamo",
                             opset_version=opset, lowering=lowering)
        np.savez(out / f"{name}.npz", x=x, expected=expected)
        written.append(out / f"{name}.onnx")
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/exported_models.py OUT_DIR")
    for path in export_all(sys.argv[1]):
        print(path)
