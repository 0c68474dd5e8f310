"""``opbridge demo``: the end-to-end workflow on a small conv net.

PyTorch model with opbridge GroupNorm layers -> ONNX (dynamo and TorchScript exporters) ->
ONNX Runtime with opbridge's library -> compared with PyTorch, error and time per exporter.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def _net():
    import torch

    import opbridge.nn

    class SmallConvNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(
                torch.nn.Conv2d(3, 32, 3, padding=1),
                opbridge.nn.GroupNorm(8, 32),
                torch.nn.ReLU(),
                torch.nn.Conv2d(32, 64, 3, padding=1, stride=2),
                opbridge.nn.GroupNorm(16, 64, eps=1e-3),
                torch.nn.ReLU(),
                torch.nn.Conv2d(64, 64, 3, padding=1),
                opbridge.nn.GroupNorm(4, 64, affine=False),
                torch.nn.ReLU(),
            )
            self.head = torch.nn.Linear(64, 10)

        def forward(self, x):
            return self.head(self.body(x).mean(dim=(2, 3)))

    return SmallConvNet()


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def run_demo(out_dir: str = "opbridge-demo", repeats: int = 20) -> int:
    import torch

    import opbridge
    import opbridge.onnx

    torch.manual_seed(0)
    model = _net().eval()
    # Non-trivial affine parameters, so that a mix-up of scale/bias or channels shows.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, opbridge.nn.GroupNorm) and m.affine:
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    x_export = torch.randn(2, 3, 32, 32)
    # A different batch size than at export: the batch dimension is dynamic.
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        ref = model(x).numpy()
        t_torch = _time(lambda: model(x), repeats)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, dynamo in (("dynamo", True), ("torchscript", False)):
        path = out / f"small_convnet_{name}.onnx"
        proto = opbridge.onnx.export(model, (x_export,), path, dynamo=dynamo)
        n_custom = sum(1 for n in proto.graph.node if n.domain == opbridge.DOMAIN)
        sess = opbridge.InferenceSession(str(path))
        feed = {sess.get_inputs()[0].name: x.numpy()}
        y = sess.run(None, feed)[0]
        err = float(np.max(np.abs(y - ref)))
        t_ort = _time(lambda: sess.run(None, feed), repeats)
        rows.append((name, n_custom, err, t_ort, t_torch, str(path.resolve())))

    print(f"opbridge {opbridge.__version__} demo: small conv net with 3 opbridge GroupNorm layers, "
          f"input {tuple(x.shape)} (exported with batch {x_export.shape[0]}, batch dim dynamic)")
    header = f"{'exporter':12s} {'GroupNorm nodes':>15s} {'max abs err':>12s} {'ORT ms':>8s} {'torch ms':>9s} {'ORT/torch':>10s}"
    print(header)
    print("-" * len(header))
    ok = True
    for name, n_custom, err, t_ort, t_t, _ in rows:
        print(f"{name:12s} {n_custom:15d} {err:12.2e} {t_ort:8.3f} {t_t:9.3f} {t_ort / t_t:9.2f}x")
        ok &= err < 1e-5 and n_custom == 3
    print("\nONNX files:")
    for name, *_, path in rows:
        print(f"  {name:12s} {path}")
    print(f"\nmodels use domain {opbridge.DOMAIN}; run them anywhere with "
          "SessionOptions.register_custom_ops_library(opbridge.get_library_path())")
    if not ok:
        print("demo FAILED: error >= 1e-5 or unexpected node count")
        return 1
    return 0
