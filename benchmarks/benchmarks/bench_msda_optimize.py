"""`opbridge optimize` on plain exports of the DETR family (benchmarks/benchmarks/_msda_models.py:
transformers' Deformable DETR, RT-DETR v1/v2, D-FINE, Grounding DINO, Mask2Former, OneFormer's pixel
decoder; mmcv's and Ultralytics' fallback re-implemented): ORT seconds per forward of the plain
export and of the same file after ``opbridge optimize``, and the speed-up, side by side in one
process; for the families ``opbridge.nn.convert`` knows, also the converted model's export timed
against the optimized file (``MsdaOptimizeVsConvert``: what the rewrite gives relative to
``convert`` + re-export, goal >= 0.95). The models are the small random-init configs of
tests/optimize/test_optimize_msda.py at a larger image (320x416): the deformable attention's share
of the time grows with the image.

The plain export is the dynamo exporter's at opset 18 (TorchScript's writes a float64 grid for a
float32 image in transformers' models, which ORT has no GridSample kernel for). Needs transformers;
skipped with a reason where it is missing. Quick run outside asv:
    cd benchmarks && python -m benchmarks.bench_msda_optimize
"""

from __future__ import annotations

import io
import os
import tempfile

import numpy as np

from ._common import measure_speedup, ort_runner, ort_session, ort_value, torch_or_skip

FAMILIES = ["deformable_detr", "rt_detr", "rt_detr_v2", "d_fine", "grounding_dino", "mask2former",
            "oneformer_pixel_decoder", "mmcv_fallback", "ultralytics_rtdetr"]
# The families opbridge.nn.convert knows (transformers' models): their converted export is timed too.
CONVERTIBLE = FAMILIES[:7]
IMAGE = (320, 416)
# Max |optimized - plain| / max(1, max |plain|) accepted before timing.
AGREEMENT = 1e-3
_CACHE: dict = {}


def _build(family):
    torch = torch_or_skip()
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise NotImplementedError("transformers is not installed (pip install 'opbridge[models]')") from e
    from . import _msda_models as models

    torch.manual_seed(0)
    builder = models.FAMILIES[family]
    if family in ("mmcv_fallback", "ultralytics_rtdetr"):
        h, w = IMAGE[0] // 8, IMAGE[1] // 8
        return builder(levels=[(h, w), (h // 2, w // 2), (h // 4, w // 4), (h // 8, w // 8)], queries=300)
    return builder(height=IMAGE[0], width=IMAGE[1])


def _error(got, want):
    """Normalized max error over the finite values; inf for non-finite values that differ (Grounding
    DINO's logits are -inf where there is no text token)."""
    finite = np.isfinite(want)
    if not np.array_equal(got[~finite], want[~finite]):
        return float("inf")
    g, w = got[finite].astype(np.float64), want[finite].astype(np.float64)
    return float(np.max(np.abs(g - w), initial=0.0)) / max(1.0, float(np.max(np.abs(w), initial=0.0)))


def _setup(family):
    if family in _CACHE:
        entry = _CACHE[family]
        if isinstance(entry, Exception):
            raise entry
        return entry
    import onnx

    from opbridge._optimize import optimize

    from . import _msda_models as models

    built = _build(family)
    with tempfile.TemporaryDirectory() as folder:
        src, dst = os.path.join(folder, "plain.onnx"), os.path.join(folder, "optimized.onnx")
        models.export(built, src, dynamo=True, opset=18)
        report = optimize(src, dst, out=io.StringIO())
        if not report.ok:
            _CACHE[family] = NotImplementedError(f"opbridge optimize failed: {report.error}")
            raise _CACHE[family]
        plain, optimized = ort_session(onnx.load(src)), ort_session(onnx.load(dst), custom_ops=True)
    feeds = {i.name: x.numpy() for i, x in zip(plain.get_inputs(), built.inputs)}
    want, got = plain.run(None, feeds), optimized.run(None, feeds)
    err = max(_error(g, e) for g, e in zip(got, want))
    if not err <= AGREEMENT:
        _CACHE[family] = NotImplementedError(f"{family}: optimized output differs (normalized max error {err:.3g})")
        raise _CACHE[family]
    values = {k: ort_value(v, str(v.dtype)) for k, v in feeds.items()}
    runners = {"plain export": ort_runner(plain, values), "optimized": ort_runner(optimized, values)}
    if family in CONVERTIBLE:
        converted = _converted(built)
        got = converted.run(None, feeds)
        err = max(_error(g, e) for g, e in zip(got, want))
        if not err <= AGREEMENT:
            _CACHE[family] = NotImplementedError(f"{family}: converted export differs (normalized max error {err:.3g})")
            raise _CACHE[family]
        runners["converted"] = ort_runner(converted, values)
    _CACHE[family] = runners
    return _CACHE[family]


def _converted(built):
    """An ORT session of ``opbridge.nn.convert`` + ``opbridge.onnx.export`` of the same model (a copy;
    dynamo, opset 18, the plain export's input names and patches): what a user who still holds the
    torch model gets."""
    import copy

    import opbridge.nn
    import opbridge.onnx

    from . import _msda_models as models

    torch_or_skip()
    model = opbridge.nn.convert(copy.deepcopy(built.model))
    with models.exporting(built, dynamo=True):
        proto = opbridge.onnx.export(model, built.inputs, dynamo=True, opset_version=18, dynamic_batch=False,
                                     input_names=built.names)
    return ort_session(proto, custom_ops=True)


class MsdaOptimizeOrt:
    """Seconds per forward in ONNX Runtime (CPU): the plain export and after ``opbridge optimize``."""

    params = (FAMILIES, ["plain export", "optimized"])
    param_names = ["family", "variant"]
    timeout = 900

    def setup(self, family, variant):
        self.fn = _setup(family)[variant]

    def time_forward(self, family, variant):
        self.fn()


class MsdaOptimizeSpeedup:
    """plain export / optimized, side by side in one process."""

    params = (FAMILIES,)
    param_names = ["family"]
    timeout = 900

    def setup(self, family):
        self.runners = _setup(family)

    def track_speedup(self, family):
        return measure_speedup(self.runners["optimized"], self.runners["plain export"], rounds=5,
                               round_seconds=0.2)

    track_speedup.unit = "x"


def _vs_convert(runners):
    """time(converted export) / time(optimized file), the two alternating."""
    return measure_speedup(runners["optimized"], runners["converted"], rounds=5, round_seconds=0.2)


class MsdaOptimizeVsConvert:
    """converted export / optimized plain export, side by side in one process (the issue's goal:
    optimize's speed-up over the plain export >= 0.95x convert + re-export's, i.e. this ratio
    >= 0.95), for the families opbridge.nn.convert knows."""

    params = (CONVERTIBLE,)
    param_names = ["family"]
    timeout = 900

    def setup(self, family):
        self.runners = _setup(family)

    def track_ratio(self, family):
        return _vs_convert(self.runners)

    track_ratio.unit = "x"


if __name__ == "__main__":
    import subprocess
    import sys

    from ._common import THREADS

    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    print(next((line for line in cpu.splitlines() if line.startswith("Model name")), "Model name: ?"))
    print(f"threads: {THREADS}")
    bench = MsdaOptimizeSpeedup()
    for fam in sys.argv[1:] or FAMILIES:
        try:
            bench.setup(fam)
            line = f"{fam}: optimized / plain {bench.track_speedup(fam)}x"
            if fam in CONVERTIBLE:
                line += f", converted / optimized {_vs_convert(bench.runners)}x"
            print(line, flush=True)
        except NotImplementedError as e:
            print(f"{fam}: skipped ({e})", flush=True)
