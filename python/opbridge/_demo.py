"""``opbridge demo``: the end-to-end workflow.

1. A small conv net with opbridge GroupNorm layers -> ONNX (dynamo and TorchScript exporters) ->
   ONNX Runtime with opbridge's library -> compared with PyTorch, error and time per exporter.
2. Matrix inverse: torch.inverse in a model -> ONNX as com.microsoft::Inverse (stock ONNX
   Runtime) or ai.opbridge::Inverse (opbridge's library), both exporters -> compared with
   PyTorch; then what each does with a singular matrix.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

import numpy as np

from ._ort import import_onnxruntime

log = logging.getLogger("opbridge")  # failures on stderr (the command line's handler), also at -q


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


def run_demo(out_dir: str = "opbridge-demo", repeats: int = 20, out: TextIO | None = None) -> int:
    """Runs the demo, printing its report to ``out`` (stdout) as it goes; 0 when every result
    matches PyTorch, else 1 (each failure also logged as an error)."""
    out = out or sys.stdout
    started = time.perf_counter()
    import torch

    import opbridge
    import opbridge.onnx

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)  # line by line: each row follows an export of a few seconds

    say(f"opbridge {opbridge.__version__} demo: two small models exported with both torch exporters, run in ONNX "
        f"Runtime and compared with PyTorch; about half a minute on 2 cores. Files go to {out_dir}/.")
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

    out_path = Path(out_dir)
    out_path.mkdir(parents=True, exist_ok=True)
    say(f"\n1. a small conv net with 3 opbridge GroupNorm layers, input {tuple(x.shape)} float32 (exported with "
        f"batch {x_export.shape[0]}: the batch dimension is dynamic)")
    header = f"{'exporter':12s} {'GroupNorm nodes':>15s} {'max abs err':>12s} {'ORT ms':>8s} {'torch ms':>9s} {'ORT/torch':>10s}"
    say(header)
    say("-" * len(header))
    ok = True
    paths = []
    for name, dynamo in (("dynamo", True), ("torchscript", False)):
        path = out_path / f"small_convnet_{name}.onnx"
        proto = opbridge.onnx.export(model, (x_export,), path, dynamo=dynamo)
        n_custom = sum(1 for n in proto.graph.node if n.domain == opbridge.DOMAIN)
        sess = opbridge.InferenceSession(str(path))
        feed = {sess.get_inputs()[0].name: x.numpy()}
        y = sess.run(None, feed)[0]
        err = float(np.max(np.abs(y - ref)))
        t_ort = _time(lambda: sess.run(None, feed), repeats)
        say(f"{name:12s} {n_custom:15d} {err:12.2e} {t_ort:8.3f} {t_torch:9.3f} {t_ort / t_torch:9.2f}x")
        paths.append((name, str(path.resolve())))
        if not (err < 1e-5 and n_custom == 3):
            log.error("demo: the %s export has %d opbridge GroupNorm nodes (expected 3) and differs from PyTorch "
                      "by %.2e (expected < 1e-5)", name, n_custom, err)
            ok = False
    say(f"max abs err: the largest difference from PyTorch's output. ORT ms, torch ms: the fastest of {repeats} "
        "runs of the whole model on that input, in ONNX Runtime and in PyTorch; ORT/torch below 1: ONNX Runtime "
        "is faster.")
    say("ONNX files:")
    for name, path_text in paths:
        say(f"  {name:12s} {path_text}")
    say(f"They use domain {opbridge.DOMAIN}; run them anywhere with "
        "SessionOptions.register_custom_ops_library(opbridge.get_library_path()).")
    ok &= _inverse_demo(out_path, repeats, say)
    say(f"\n{'done' if ok else 'FAILED (see the errors above)'} in {time.perf_counter() - started:.0f} s")
    return 0 if ok else 1


def _inverse_demo(out: Path, repeats: int, say: Callable[[str], None]) -> bool:
    ort = import_onnxruntime()
    import torch

    import opbridge
    import opbridge.onnx

    class InverseNet(torch.nn.Module):
        # The model of ONNX Runtime's note "Export of Custom Ops".
        def forward(self, x):
            return torch.inverse(x) + x

    model = InverseNet().eval()
    torch.manual_seed(0)
    # Well-conditioned random matrices (eigenvalues near 4), so that float32 errors stay small.
    x_export = torch.randn(2, 8, 8) + 4 * torch.eye(8)
    x = torch.randn(1024, 8, 8) + 4 * torch.eye(8)
    with torch.no_grad():
        ref = model(x).numpy()
        t_torch = _time(lambda: model(x), repeats)
    scale = float(np.abs(ref).max())

    say(f"\n2. torch.inverse(x) + x, input {tuple(x.shape)} float32, exported two ways: lowering standard = "
        f"com.microsoft::Inverse (stock ONNX Runtime), custom = {opbridge.DOMAIN}::Inverse (opbridge's library)")
    header = (f"{'exporter':12s} {'lowering':9s} {'node':26s} {'session':9s} {'max rel err':>12s} "
              f"{'ORT ms':>8s} {'torch ms':>9s}")
    say(header)
    say("-" * len(header))
    ok = True
    sessions = {}
    for name, dynamo in (("dynamo", True), ("torchscript", False)):
        for lowering in ("standard", "custom"):
            path = out / f"inverse_{name}_{lowering}.onnx"
            proto = opbridge.onnx.export(model, (x_export,), path, dynamo=dynamo, lowering=lowering)
            nodes = [f"{n.domain}::{n.op_type}" for n in proto.graph.node if n.op_type == "Inverse"]
            if lowering == "standard":
                sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # no opbridge
            else:
                so = ort.SessionOptions()
                so.log_severity_level = 4  # the singular-matrix error below is reported here, not logged
                sess = opbridge.InferenceSession(str(path), so)
            sessions[lowering] = sess
            feed = {sess.get_inputs()[0].name: x.numpy()}
            err = float(np.abs(sess.run(None, feed)[0] - ref).max()) / scale
            t_ort = _time(lambda: sess.run(None, feed), repeats)
            say(f"{name:12s} {lowering:9s} {','.join(nodes):26s} {'stock' if lowering == 'standard' else 'opbridge':9s} "
                  f"{err:12.2e} {t_ort:8.3f} {t_torch:9.3f}")
            expected = "com.microsoft::Inverse" if lowering == "standard" else f"{opbridge.DOMAIN}::Inverse"
            ok &= err < 1e-4 and nodes == [expected]

    say(f"max rel err: the largest difference from PyTorch's output over its largest magnitude. ORT ms: the fastest "
        f"of {repeats} runs in ONNX Runtime; torch ms: the same in PyTorch (one figure for all four).")

    # A batch whose matrix 3 is singular (two equal rows).
    xs = x[:5].clone()
    xs[3, 1] = xs[3, 0]
    say("\nthe same batch with matrix 3 singular (two equal rows):")
    try:
        torch.inverse(xs)
        say("  torch.inverse:               no error")
    except RuntimeError as e:
        say(f"  torch.inverse:               {type(e).__name__.lstrip('_')}: {str(e).splitlines()[0]}")
    feed = {sessions["standard"].get_inputs()[0].name: xs.numpy()}
    y = sessions["standard"].run(None, feed)[0]
    say(f"  com.microsoft::Inverse:      no error; matrix 3 has {int((~np.isfinite(y[3])).sum())} inf/NaN "
          f"of {y[3].size} entries, max |y| = {float(np.abs(y[3][np.isfinite(y[3])]).max(initial=0)):.3g}")
    try:
        sessions["custom"].run(None, feed)
        say(f"  {opbridge.DOMAIN}::Inverse:        no error")
        ok = False
    except Exception as e:  # onnxruntime's own exception types
        msg = str(e)
        say(f"  {opbridge.DOMAIN}::Inverse:        {type(e).__name__}: ...{msg[msg.find(opbridge.DOMAIN):].strip()}")
        ok &= "matrix 3 of the batch is singular" in msg
    if not ok:
        log.error("demo: an Inverse export differs from PyTorch by 1e-4 or more (relative), has other nodes than "
                  "expected, or ran a singular matrix without an error")
    return ok
