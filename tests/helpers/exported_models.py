"""Models exported by opbridge.onnx.export, saved with inputs and torch's outputs, so that
environments without torch (the onnxruntime version matrix) can run real exported models.

    python tests/helpers/exported_models.py OUT_DIR      # needs torch; writes NAME.onnx + NAME.npz

tests/ort/test_ort_exported.py runs them when OPBRIDGE_EXPORTED_MODELS names that directory.
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


# Inverse: a batched Kalman update with opbridge.ops.inverse(on_singular="nan") (ai.opbridge::Inverse
# version 2), and the ONNX Runtime note's torch.inverse(x) + x (com.microsoft::Inverse, stock ORT).
INVERSE_CASES = [("dynamo", 17), ("torchscript", 17), ("dynamo", 20)]


def _kalman_model(n=4, m=2):
    import torch

    import opbridge.ops

    class KalmanUpdate(torch.nn.Module):
        """One Kalman measurement update per track; a track whose innovation covariance S is
        singular gets NaN instead of failing the batch."""

        def __init__(self, h):
            super().__init__()
            self.register_buffer("h", h)

        def forward(self, x, p, z, r):
            ht = self.h.transpose(0, 1)
            pht = p @ ht
            k = pht @ opbridge.ops.inverse(self.h @ pht + r, on_singular="nan")
            return x + (k @ (z - x @ ht).unsqueeze(-1)).squeeze(-1), p - k @ self.h @ p

    h = torch.from_numpy(np.random.default_rng(1).standard_normal((m, n)).astype(np.float32))
    return KalmanUpdate(h).eval()


def _kalman_inputs(rng, tracks, n=4, m=2, degenerate=()):
    a = rng.standard_normal((tracks, n, n))
    p = a @ a.transpose(0, 2, 1) + 0.1 * np.eye(n)
    r = np.stack([np.diag(rng.uniform(0.05, 0.5, m)) for _ in range(tracks)])
    for i in degenerate:  # S = H 0 H^T + 0 is singular
        p[i] = 0.0
        r[i] = 0.0
    return tuple(v.astype(np.float32) for v in (rng.standard_normal((tracks, n)), p, rng.standard_normal((tracks, m)), r))


def _save(path: Path, inputs, expected, atol=None) -> None:
    """NAME.npz: input_<k> in the model's input order, expected_<k> per output, optional atol."""
    arrays = {f"input_{k}": v for k, v in enumerate(inputs)}
    arrays.update({f"expected_{k}": v for k, v in enumerate(expected)})
    if atol is not None:
        arrays["atol"] = np.float64(atol)
    np.savez(path, **arrays)


def export_inverse(out: Path) -> list[Path]:
    import torch

    import opbridge.onnx

    written = []
    rng = np.random.default_rng(2)
    kalman = _kalman_model()
    feeds = _kalman_inputs(rng, 7, degenerate=(2, 5))
    with torch.no_grad():
        expected = [t.numpy() for t in kalman(*map(torch.from_numpy, feeds))]
    for exporter, opset in INVERSE_CASES:
        name = f"kalman_{exporter}_opset{opset}"
        example = tuple(map(torch.from_numpy, _kalman_inputs(rng, 3)))
        opbridge.onnx.export(kalman, example, out / f"{name}.onnx", dynamo=exporter == "dynamo", opset_version=opset)
        _save(out / f"{name}.npz", feeds, expected, atol=1e-4 * max(np.nanmax(np.abs(e)) for e in expected))
        written.append(out / f"{name}.onnx")

    class OrtNoteExample(torch.nn.Module):
        def forward(self, x):
            return torch.inverse(x) + x

    x = rng.standard_normal((5, 3, 3)).astype(np.float32) + 3 * np.eye(3, dtype=np.float32)
    with torch.no_grad():
        expected = [OrtNoteExample()(torch.from_numpy(x)).numpy()]
    for exporter in ("dynamo", "torchscript"):
        name = f"torch_inverse_{exporter}_opset17_standard"
        opbridge.onnx.export(OrtNoteExample().eval(), (torch.randn(2, 3, 3),), out / f"{name}.onnx",
                             dynamo=exporter == "dynamo", opset_version=17)
        _save(out / f"{name}.npz", [x], expected)
        written.append(out / f"{name}.onnx")
    return written


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
        _save(out / f"{name}.npz", [x], [expected])
        written.append(out / f"{name}.onnx")
    return written + export_inverse(out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/helpers/exported_models.py OUT_DIR")
    for path in export_all(sys.argv[1]):
        print(path)
