"""Multi-scale deformable attention on the CPU: opbridge (torch op and ORT custom op) against the
pure-PyTorch function models otherwise run (Deformable-DETR's ms_deform_attn_core_pytorch, one
grid_sample per level) and that function's plain dynamo export run in stock ONNX Runtime (what
users ship today: per-level GridSample, Concat, Mul, ReduceSum).

Shapes: one encoder call of Deformable DETR on a 512 x 512 image (levels 64x64, 32x32, 16x16,
8x8; every pixel a query: Lq = S = 5440) and one decoder call (Lq = 300), batch 2, 8 heads of
32 channels, 4 points per level. Two location sets: "model" (reference points + the sampling
offsets a random-init Deformable DETR produces: per head a direction, points 1..4 pixels out
along it, plus a little noise; the encoder's reference points are its pixel centres, the
decoder's scattered) and "uniform" (uniform in [0, 1]: scattered, cache-unfriendly).
"""

from __future__ import annotations

import math

import numpy as np

from ._common import THREADS, measure_speedup, opbridge_torch_op, ort_runner, ort_session, ort_value, torch_or_skip

LEVELS = ((64, 64), (32, 32), (16, 16), (8, 8))
N, M, D, P = 2, 8, 32, 4
S = sum(h * w for h, w in LEVELS)
QUERIES = {"encoder": S, "decoder": 300}
LOCATIONS = ["model", "uniform"]
IMPLS = ["opbridge-torch", "torch-pytorch", "opbridge-ort", "ort-pytorch-export"]
IR_VERSION = 10


def inputs(shape, locations, seed=0):
    """float32 (value, spatial_shapes, level_start_index, sampling_locations, attention_weights)."""
    rng = np.random.default_rng(seed)
    lq = QUERIES[shape]
    L = len(LEVELS)
    value = rng.standard_normal((N, S, M, D)).astype(np.float32)
    logits = rng.standard_normal((N, lq, M, L * P))
    weights = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    if locations == "uniform":
        loc = rng.uniform(0, 1, (N, lq, M, L, P, 2))
    else:
        if shape == "encoder":
            ref = np.concatenate([np.stack(np.meshgrid((np.arange(w) + 0.5) / w, (np.arange(h) + 0.5) / h,
                                                       indexing="xy"), -1).reshape(-1, 2) for h, w in LEVELS])
        else:
            ref = rng.uniform(0.05, 0.95, (lq, 2))
        # Deformable DETR's sampling_offsets bias at init: head m looks along angle 2 pi m / M,
        # point p (p + 1) pixels out, on every level.
        theta = np.arange(M) * (2 * math.pi / M)
        grid = np.stack([np.cos(theta), np.sin(theta)], -1)
        grid = grid / np.abs(grid).max(-1, keepdims=True)
        offsets = grid[:, None, None, :] * np.arange(1, P + 1)[None, None, :, None]  # (M, 1, P, 2)
        offsets = offsets + 0.25 * rng.standard_normal((N, lq, M, L, P, 2))
        wh = np.array([[w, h] for h, w in LEVELS], np.float64).reshape(1, 1, 1, L, 1, 2)
        loc = ref[None, :, None, None, None, :] + offsets / wh
    shapes = np.array(LEVELS, np.int64)
    starts = np.concatenate([[0], np.cumsum(shapes.prod(1))[:-1]]).astype(np.int64)
    return (value, shapes, starts, loc.astype(np.float32), weights.reshape(N, lq, M, L, P).astype(np.float32))


def ms_deform_attn_pytorch(value, spatial_shapes, sampling_locations, attention_weights):
    """Deformable-DETR's ms_deform_attn_core_pytorch (also mmcv's and transformers' fallback):
    one grid_sample per level. spatial_shapes: a list of (H, W)."""
    import torch
    import torch.nn.functional as F

    n, _, m, d = value.shape
    _, lq, m, L, p, _ = sampling_locations.shape
    value_list = value.split([h * w for h, w in spatial_shapes], dim=1)
    grids = 2 * sampling_locations - 1
    sampled = []
    for level, (h, w) in enumerate(spatial_shapes):
        v = value_list[level].flatten(2).transpose(1, 2).reshape(n * m, d, h, w)
        g = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        sampled.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros", align_corners=False))
    weights = attention_weights.transpose(1, 2).reshape(n * m, 1, lq, L * p)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1).view(n, m * d, lq)
    return out.transpose(1, 2).contiguous()


def model_opbridge(lq):
    from onnx import TensorProto, helper

    f, i = TensorProto.FLOAT, TensorProto.INT64
    L = len(LEVELS)
    names = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]
    node = helper.make_node("MultiScaleDeformableAttention", names, ["Y"], domain="ai.opbridge")
    graph = helper.make_graph(
        [node], "msda",
        [helper.make_tensor_value_info("value", f, [N, S, M, D]), helper.make_tensor_value_info("spatial_shapes", i, [L, 2]),
         helper.make_tensor_value_info("level_start_index", i, [L]),
         helper.make_tensor_value_info("sampling_locations", f, [N, lq, M, L, P, 2]),
         helper.make_tensor_value_info("attention_weights", f, [N, lq, M, L, P])],
        [helper.make_tensor_value_info("Y", f, [N, lq, M * D])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.opbridge", 2)],
                             ir_version=IR_VERSION)


def model_pytorch_export(args):
    """The pure-PyTorch function through torch.onnx.export(dynamo=True) with default settings."""
    torch = torch_or_skip()

    class Core(torch.nn.Module):
        def forward(self, value, sampling_locations, attention_weights):
            return ms_deform_attn_pytorch(value, [tuple(map(int, hw)) for hw in LEVELS], sampling_locations,
                                          attention_weights)

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(Core().eval(), tuple(torch.from_numpy(args[i]) for i in (0, 3, 4)), dynamo=True,
                                    verbose=False)
    return program.model_proto


def make_fn(impl, shape, locations, seed=0):
    """A no-argument callable running one call with implementation `impl`; NotImplementedError
    where it cannot run here."""
    args = inputs(shape, locations, seed)
    if impl in ("opbridge-torch", "torch-pytorch"):
        torch = torch_or_skip()
        t = [torch.from_numpy(a) for a in args]
        if impl == "opbridge-torch":
            op = opbridge_torch_op("ms_deform_attn")
            return lambda: op(*t)
        levels = [tuple(map(int, hw)) for hw in LEVELS]
        return lambda: ms_deform_attn_pytorch(t[0], levels, t[3], t[4])
    if impl == "opbridge-ort":
        sess = ort_session(model_opbridge(QUERIES[shape]), custom_ops=True)
        names = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]
        feeds = {n: ort_value(a, "float32" if a.dtype == np.float32 else "int64") for n, a in zip(names, args)}
    else:
        proto = model_pytorch_export(args)
        sess = ort_session(proto)
        feeds = {inp.name: ort_value(args[i], "float32") for inp, i in zip(sess.get_inputs(), (0, 3, 4))}
    fn = ort_runner(sess, feeds)
    try:
        fn()
    except Exception as e:
        raise NotImplementedError(f"{impl} fails: {e}".splitlines()[0]) from e
    return fn


class MsDeformAttn:
    """Time per call of each implementation (THREADS threads, see _common.py)."""

    params = (list(QUERIES), LOCATIONS, IMPLS)
    param_names = ["shape", "locations", "impl"]
    warmup_time = 0.5
    timeout = 600

    def setup(self, shape, locations, impl):
        self.fn = make_fn(impl, shape, locations)

    def time_ms_deform_attn(self, shape, locations, impl):
        self.fn()


COMPARISONS = {
    "opbridge-torch/torch-pytorch": ("opbridge-torch", "torch-pytorch"),
    "opbridge-ort/ort-pytorch-export": ("opbridge-ort", "ort-pytorch-export"),
    "opbridge-ort/torch-pytorch": ("opbridge-ort", "torch-pytorch"),
}


class MsDeformAttnSpeedup:
    """Speed-up of opbridge over each baseline (float32), both timed side by side in one process:
    time(baseline) / time(opbridge), > 1 means opbridge is faster. Goals (THREADS = 2, encoder,
    model locations): >= 25x over the pure-PyTorch function in torch and >= 15x over its export
    in stock ORT (uniform locations: >= 15x / >= 10x; decoder: >= 15x / >= 10x)."""

    params = (list(QUERIES), LOCATIONS, list(COMPARISONS))
    param_names = ["shape", "locations", "comparison"]
    unit = "x"
    timeout = 900

    def setup(self, shape, locations, comparison):
        ours, theirs = COMPARISONS[comparison]
        self.ours = make_fn(ours, shape, locations)
        self.theirs = make_fn(theirs, shape, locations)

    def track_speedup(self, shape, locations, comparison):
        return measure_speedup(self.ours, self.theirs, rounds=5, round_seconds=0.2)


class MsDeformAttnBackward:
    """Backward (all three gradients) of the torch op against autograd through the pure-PyTorch
    function: time(pure PyTorch forward + backward) / time(opbridge forward + backward)."""

    params = (list(QUERIES), LOCATIONS)
    param_names = ["shape", "locations"]
    unit = "x"
    timeout = 900

    def setup(self, shape, locations):
        torch = torch_or_skip()
        op = opbridge_torch_op("ms_deform_attn")
        args = inputs(shape, locations)
        levels = [tuple(map(int, hw)) for hw in LEVELS]

        def tensors():
            t = [torch.from_numpy(a) for a in args]
            for i in (0, 3, 4):
                t[i].requires_grad_()
            return t

        ta, tb = tensors(), tensors()

        def ours():
            op(*ta).sum().backward()

        def theirs():
            ms_deform_attn_pytorch(tb[0], levels, tb[3], tb[4]).sum().backward()

        self.ours, self.theirs = ours, theirs

    def track_speedup(self, shape, locations):
        return measure_speedup(self.ours, self.theirs, rounds=3, round_seconds=0.3)
