"""A whole DETR model with multi-scale deformable attention: transformers' DeformableDetr (random
init, built from a config, no download) in the configuration of the MSDA issue -- d_model 256,
4 levels, 8 heads, 4 points, 6 encoder + 6 decoder layers, 300 queries, ResNet-18-like backbone,
input 2x3x512x512 -- as transformers runs it and after ``opbridge.nn.convert``:

  * torch eager: native vs converted (speed-up = native / converted);
  * ONNX Runtime: the plain dynamo export of the native model (the MSDA function becomes a
    GridSample/Concat chain) vs the converted model exported by ``opbridge.onnx.export`` (one
    ai.opbridge::MultiScaleDeformableAttention node per layer) and with lowering="standard", and
    vs that plain export rewritten by ``opbridge optimize`` (the file a user already holds);
    ``OptimizeVsConvert`` tracks the rewrite's speed-up over the plain export divided by
    convert + re-export's, side by side (goal: >= 0.95).

Needs the `models` extra (transformers); skipped with a reason where it is missing. One forward
takes seconds: the speed-ups are measured with few rounds. Quick run outside asv:
    cd benchmarks && python -m benchmarks.bench_ms_deform_attn_model
"""

from __future__ import annotations

import copy
import time

import numpy as np

from ._common import SETTLE_SECONDS, ort_runner, ort_session, ort_value, torch_or_skip

INPUT = (2, 3, 512, 512)
# Max |ORT - torch| / max(1, max |torch|) accepted before timing an ORT variant.
AGREEMENT = 1e-3
_CACHE: dict = {}


def _model():
    torch = torch_or_skip()
    try:
        import transformers
    except ImportError as e:
        raise NotImplementedError("transformers is not installed (pip install 'opbridge[models]')") from e
    backbone = transformers.ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                                         layer_type="basic", out_features=["stage2", "stage3", "stage4"])
    cfg = transformers.DeformableDetrConfig(
        backbone_config=backbone, use_timm_backbone=False, use_pretrained_backbone=False, d_model=256,
        encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
        encoder_ffn_dim=1024, decoder_ffn_dim=1024, num_queries=300, num_feature_levels=4, encoder_n_points=4,
        decoder_n_points=4)
    torch.manual_seed(0)
    detr = transformers.DeformableDetrForObjectDetection(cfg).eval()

    class Detector(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.detr = detr

        def forward(self, pixel_values):
            out = self.detr(pixel_values=pixel_values)
            return out.logits, out.pred_boxes

    return Detector().eval()


def _setup():
    if "setup" in _CACHE:
        return _CACHE["setup"]
    torch = torch_or_skip()
    import opbridge.nn

    native = _model()
    converted = opbridge.nn.convert(copy.deepcopy(native))
    x = torch.from_numpy(np.random.default_rng(0).standard_normal(INPUT).astype(np.float32))
    with torch.no_grad():
        expected = [t.numpy() for t in native(x)]
    _CACHE["setup"] = (native, converted, x, expected)
    return _CACHE["setup"]


def _torch_runner(variant):
    torch = torch_or_skip()
    native, converted, x, _ = _setup()
    model = native if variant == "native" else converted

    def fn():
        with torch.no_grad():
            model(x)

    return fn


def _ort_runner(variant):
    if variant in _CACHE:
        entry = _CACHE[variant]
        if isinstance(entry, Exception):
            raise entry
        return entry
    import logging
    import warnings

    torch = torch_or_skip()
    import opbridge.onnx

    native, converted, x, expected = _setup()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if variant == "plain dynamo export, opbridge optimize":
            proto, custom = _optimized(native, x), True
        elif variant == "plain dynamo export":
            proto, custom = torch.onnx.export(native, (x,), dynamo=True, opset_version=18,
                                              verbose=False).model_proto, False
        elif variant == "converted, custom lowering":
            proto, custom = opbridge.onnx.export(converted, (x,), dynamic_batch=False), True
        else:
            proto, custom = opbridge.onnx.export(converted, (x,), dynamic_batch=False, lowering="standard"), False
    sess = ort_session(proto, custom_ops=custom)
    name = sess.get_inputs()[0].name
    got = sess.run(None, {name: x.numpy()})
    err = max(float(np.max(np.abs(g - e))) / max(1.0, float(np.max(np.abs(e)))) for g, e in zip(got, expected))
    if not err <= AGREEMENT:
        _CACHE[variant] = NotImplementedError(f"{variant}: ORT output differs from torch (normalized max error "
                                              f"{err:.3g})")
        raise _CACHE[variant]
    _CACHE[variant] = ort_runner(sess, {name: ort_value(x.numpy(), "float32")})
    return _CACHE[variant]


def _optimized(native, x):
    """The plain dynamo export of ``native`` rewritten by ``opbridge.optimize`` (through files, as
    the command runs), as a ModelProto."""
    import io
    import os
    import tempfile

    import onnx
    import torch

    from opbridge._optimize import optimize

    with tempfile.TemporaryDirectory() as folder:
        src, dst = os.path.join(folder, "plain.onnx"), os.path.join(folder, "optimized.onnx")
        torch.onnx.export(native, (x,), src, dynamo=True, opset_version=18, external_data=False, verbose=False)
        report = optimize(src, dst, out=io.StringIO())
        if not report.ok:
            raise NotImplementedError(f"opbridge optimize failed: {report.error}")
        return onnx.load(dst)


def _speedup(ours, theirs, rounds=3):
    """time(theirs) / time(ours) for calls of seconds each: one untimed call each, then `rounds`
    alternating timed calls; the median of the per-round ratios."""
    ours()
    theirs()
    ratios = []
    for r in range(rounds):
        times = {}
        for name, fn in ((("ours", ours), ("theirs", theirs)) if r % 2 == 0 else (("theirs", theirs), ("ours", ours))):
            time.sleep(SETTLE_SECONDS)
            t0 = time.perf_counter()
            fn()
            times[name] = time.perf_counter() - t0
        ratios.append(times["theirs"] / times["ours"])
    return round(float(np.median(ratios)), 3)


TORCH_VARIANTS = ["native", "converted"]
ORT_VARIANTS = ["plain dynamo export", "converted, custom lowering", "converted, standard lowering",
                "plain dynamo export, opbridge optimize"]


class DeformableDetrTorch:
    """Seconds per forward in torch eager (CPU)."""

    params = (TORCH_VARIANTS,)
    param_names = ["variant"]
    timeout = 1200
    number = 1
    repeat = 3

    def setup(self, variant):
        self.fn = _torch_runner(variant)
        self.fn()

    def time_forward(self, variant):
        self.fn()


class DeformableDetrOrt:
    """Seconds per forward in ONNX Runtime (CPU)."""

    params = (ORT_VARIANTS,)
    param_names = ["variant"]
    timeout = 1200
    number = 1
    repeat = 3

    def setup(self, variant):
        self.fn = _ort_runner(variant)
        self.fn()

    def time_forward(self, variant):
        self.fn()


class DeformableDetrSpeedup:
    """Native / converted in torch eager, and plain dynamo export / opbridge's export in ORT,
    side by side in one process."""

    params = (["torch eager: converted"] + [f"ORT: {v}" for v in ORT_VARIANTS[1:]],)
    param_names = ["variant"]
    timeout = 1800

    def setup(self, variant):
        if variant.startswith("torch"):
            self.ours, self.theirs = _torch_runner("converted"), _torch_runner("native")
        else:
            self.ours, self.theirs = _ort_runner(variant[len("ORT: "):]), _ort_runner(ORT_VARIANTS[0])

    def track_speedup(self, variant):
        return _speedup(self.ours, self.theirs)

    track_speedup.unit = "x"


class OptimizeVsConvert:
    """(plain export / optimized plain export) / (plain export / converted export), all three in
    ORT side by side in one process: what ``opbridge optimize`` gives a user who holds only the
    ONNX file, relative to re-exporting after ``opbridge.nn.convert``."""

    timeout = 2400

    def setup(self):
        self.plain = _ort_runner(ORT_VARIANTS[0])
        self.converted = _ort_runner("converted, custom lowering")
        self.optimized = _ort_runner("plain dynamo export, opbridge optimize")

    def track_ratio(self):
        # (plain / optimized) / (plain / converted) = converted / optimized: timed directly, the
        # two alternating, which is less noisy than the quotient of two measured speed-ups.
        return _speedup(self.optimized, self.converted, rounds=5)

    track_ratio.unit = "x"


if __name__ == "__main__":
    from ._common import THREADS

    print(f"threads: {THREADS}")
    bench = DeformableDetrSpeedup()
    for v in DeformableDetrSpeedup.params[0]:
        try:
            bench.setup(v)
            print(f"{v}: {bench.track_speedup(v)}x")
        except NotImplementedError as e:
            print(f"{v}: skipped ({e})")
    ratio = OptimizeVsConvert()
    ratio.setup()
    print(f"optimize / convert speed-up ratio: {ratio.track_ratio()}")
