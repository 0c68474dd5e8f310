"""GroupNorm on the CPU: opbridge (torch op and ORT custom op) against torch's native kernel and
ONNX Runtime's built-in GroupNormalization-21 and Reshape + InstanceNormalization lowering.

Measuring protocol of the CPU goals (GroupNormVsCopy, GroupNormVsTorch, GroupNormSpeedup):
- the two sides in one process, interleaved round by round (measure_speedup: 9 rounds, the
  median of the per-round ratios), THREADS threads each, float32;
- malloc kept from returning memory to the OS (_common.py sets what MALLOC_MMAP_THRESHOLD_ /
  MALLOC_TRIM_THRESHOLD_ set; fresh outputs otherwise fault their pages in on every call);
- three runs of the benchmark, minutes apart, reported as ranges, with the machine (`lscpu`'s
  model name, L2 and L3) and the load it ran under;
- "never behind torch": the median ratio F.group_norm / ours is >= 1.0 in each of the three runs.
The goals against a copy are for GroupNorm without SiLU: <= 1.2x where a group (contiguous) or a
sample (channels_last) fits the kernel's cache budget, <= 1.6x where it does not (a second read).
The kernel's cache-dependent choices come from the caches the OS reports (opbridge's
group_norm_cpu_choices(); benchmarks/cpp/group_norm_vs_floor.cpp prints them); the environment
variables OPBRIDGE_GROUP_NORM_CACHE_BUDGET, OPBRIDGE_GROUP_NORM_STREAM_BYTES and
OPBRIDGE_GROUP_NORM_WAVE_BYTES replace them for experiments, OPBRIDGE_GROUP_NORM_L2_BYTES and
OPBRIDGE_GROUP_NORM_L3_BYTES replace the cache sizes they are derived from, and
OPBRIDGE_GROUP_NORM_FUSE=0 turns off the fused contiguous pass."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ._common import (
    ONNX_TYPES,
    THREADS,
    measure_speedup,
    numpy_to_bf16_bits,
    opbridge_torch_op,
    ort_runner,
    ort_session,
    ort_value,
    torch_or_skip,
)

# (N, C, H, W), all with 32 groups: a ResNet-50 stage-1 activation (800 KB), a mid-sized
# diffusion U-Net block (8 MB) and a large one (16 MB, beyond what two L2s hold).
SHAPES = ["1x64x56x56", "8x256x32x32", "2x512x64x64"]
GROUPS = 32
EPS = 1e-5
DTYPES = ["float32", "float16", "bfloat16"]
IMPLS = ["opbridge-torch", "torch-native", "opbridge-ort", "ort-GroupNormalization-21", "ort-decomposition"]
# ir_version 10 covers opset 21; ORT 1.31 refuses the IR 14 that onnx 1.23 stamps by default.
IR_VERSION = 10


def parse_shape(s):
    return tuple(int(d) for d in s.split("x"))


def inputs(shape, seed=0):
    """float64 x, weight, bias: activations with a non-zero mean, weights around 1."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 2 + 0.5
    w = rng.uniform(0.5, 2.0, shape[1])
    b = rng.standard_normal(shape[1])
    return x, w, b


# ---- hand-built ONNX models ------------------------------------------------------------------


def model_opbridge(shape, dtype):
    t = ONNX_TYPES[dtype]
    c = shape[1]
    node = helper.make_node("GroupNorm", ["X", "scale", "bias"], ["Y"], domain="ai.opbridge",
                            num_groups=GROUPS, epsilon=EPS)
    graph = helper.make_graph(
        [node], "gn",
        [helper.make_tensor_value_info("X", t, shape), helper.make_tensor_value_info("scale", t, [c]),
         helper.make_tensor_value_info("bias", t, [c])],
        [helper.make_tensor_value_info("Y", t, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.opbridge", 1)],
                             ir_version=IR_VERSION)


def model_gn21(shape, dtype):
    """ONNX GroupNormalization-21 (per-channel scale and bias)."""
    t = ONNX_TYPES[dtype]
    c = shape[1]
    node = helper.make_node("GroupNormalization", ["X", "scale", "bias"], ["Y"], num_groups=GROUPS, epsilon=EPS)
    graph = helper.make_graph(
        [node], "gn21",
        [helper.make_tensor_value_info("X", t, shape), helper.make_tensor_value_info("scale", t, [c]),
         helper.make_tensor_value_info("bias", t, [c])],
        [helper.make_tensor_value_info("Y", t, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR_VERSION)


def model_decomposition(shape, dtype):
    """The classic exporter lowering: Reshape(N, G, -1) -> InstanceNormalization (unit scale,
    zero bias) -> Reshape back -> Mul(scale[C,1,1]) -> Add(bias[C,1,1])."""
    t = ONNX_TYPES[dtype]
    c = shape[1]
    affine_shape = [c] + [1] * (len(shape) - 2)
    init = [
        helper.make_tensor("grouped_shape", TensorProto.INT64, [3], [0, GROUPS, -1]),
        helper.make_tensor("ones", t, [GROUPS], [1.0] * GROUPS),
        helper.make_tensor("zeros", t, [GROUPS], [0.0] * GROUPS),
        helper.make_tensor("affine_shape", TensorProto.INT64, [len(affine_shape)], affine_shape),
    ]
    nodes = [
        helper.make_node("Shape", ["X"], ["x_shape"]),
        helper.make_node("Reshape", ["X", "grouped_shape"], ["xg"]),
        helper.make_node("InstanceNormalization", ["xg", "ones", "zeros"], ["ng"], epsilon=EPS),
        helper.make_node("Reshape", ["ng", "x_shape"], ["n"]),
        helper.make_node("Reshape", ["scale", "affine_shape"], ["scale_b"]),
        helper.make_node("Reshape", ["bias", "affine_shape"], ["bias_b"]),
        helper.make_node("Mul", ["n", "scale_b"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias_b"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes, "gn_decomposed",
        [helper.make_tensor_value_info("X", t, shape), helper.make_tensor_value_info("scale", t, [c]),
         helper.make_tensor_value_info("bias", t, [c])],
        [helper.make_tensor_value_info("Y", t, shape)], initializer=init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


# ---- one callable per implementation ----------------------------------------------------------


def make_fn(impl, shape, dtype, seed=0):
    """A no-argument callable computing GroupNorm of fresh inputs with implementation `impl`;
    NotImplementedError where that implementation cannot run this dtype here."""
    x, w, b = inputs(shape, seed)
    if impl in ("opbridge-torch", "torch-native"):
        torch = torch_or_skip()
        tdt = getattr(torch, dtype)
        xt, wt, bt = (torch.from_numpy(a).to(tdt) for a in (x, w, b))
        if impl == "opbridge-torch":
            op = opbridge_torch_op("group_norm")
            return lambda: op(xt, GROUPS, wt, bt, EPS)
        gn = torch.nn.functional.group_norm
        return lambda: gn(xt, GROUPS, wt, bt, EPS)
    build = {"opbridge-ort": model_opbridge, "ort-GroupNormalization-21": model_gn21,
             "ort-decomposition": model_decomposition}[impl]
    sess = ort_session(build(shape, dtype), custom_ops=impl == "opbridge-ort")
    if dtype == "bfloat16":
        arrays = [numpy_to_bf16_bits(a) for a in (x, w, b)]
    else:
        arrays = [a.astype(dtype) for a in (x, w, b)]
    feeds = {k: ort_value(a, dtype) for k, a in zip(("X", "scale", "bias"), arrays)}
    fn = ort_runner(sess, feeds)
    try:
        fn()
    except Exception as e:
        raise NotImplementedError(f"{impl} fails on {dtype}: {e}".splitlines()[0]) from e
    return fn


class GroupNorm:
    """Time per call of each implementation (THREADS threads, see _common.py)."""

    params = (SHAPES, DTYPES, IMPLS)
    param_names = ["shape", "dtype", "impl"]
    warmup_time = 0.2

    def setup(self, shape, dtype, impl):
        self.fn = make_fn(impl, parse_shape(shape), dtype)

    def time_group_norm(self, shape, dtype, impl):
        self.fn()


# The speed-ups the project tracks: (ours, baseline).
COMPARISONS = {
    "opbridge-ort/ort-GroupNormalization-21": ("opbridge-ort", "ort-GroupNormalization-21"),
    "opbridge-ort/ort-decomposition": ("opbridge-ort", "ort-decomposition"),
    "opbridge-ort/torch-native": ("opbridge-ort", "torch-native"),
    "opbridge-torch/torch-native": ("opbridge-torch", "torch-native"),
}


class GroupNormSpeedup:
    """Speed-up of opbridge over each baseline (float32), both timed side by side in one
    process: time(baseline) / time(opbridge), > 1 means opbridge is faster."""

    params = (SHAPES, list(COMPARISONS))
    param_names = ["shape", "comparison"]
    unit = "x"
    timeout = 300

    def setup(self, shape, comparison):
        ours, theirs = COMPARISONS[comparison]
        self.ours = make_fn(ours, parse_shape(shape), "float32")
        self.theirs = make_fn(theirs, parse_shape(shape), "float32")

    def track_speedup(self, shape, comparison):
        return measure_speedup(self.ours, self.theirs)


class GroupNorm16BitVsFloat32:
    """time(float32) / time(16-bit) per call of opbridge's op (same element count): >= 1 means
    the 16-bit kernel is at least as fast per element as the float32 one."""

    params = (SHAPES, ["float16", "bfloat16"], ["opbridge-torch", "opbridge-ort"])
    param_names = ["shape", "dtype", "impl"]
    unit = "x"

    def setup(self, shape, dtype, impl):
        self.half = make_fn(impl, parse_shape(shape), dtype)
        self.full = make_fn(impl, parse_shape(shape), "float32")

    def track_speedup(self, shape, dtype, impl):
        return measure_speedup(self.half, self.full)


# ---- against the memory floor: a same-size copy -----------------------------------------------

# Shapes of >= 1 MB (float32): where a group (NCHW) or a sample (NHWC) fits the per-core L2 (one
# read from memory suffices), and where it does not (the statistics need a second read).
# The last two have one and two channels per group (G = 32), where the channels-last statistics
# are mostly per-group work.
FLOOR_SHAPES = [
    "8x256x32x32",
    "2x512x64x64",
    "2x320x64x64",
    "2x128x64x64",
    "1x512x64x64",
    "4x512x128x128",
    "64x32x32x32",
    "32x64x32x32",
]
LAYOUTS = ["contiguous", "channels_last"]
ACTIVATIONS = ["none", "silu"]


def torch_inputs(shape, layout, seed=0):
    """inputs() as float32 torch tensors (x, weight, bias), x in the memory format `layout`."""
    torch = torch_or_skip()
    x, w, b = inputs(shape, seed)
    xt, wt, bt = (torch.from_numpy(a).float() for a in (x, w, b))
    if layout == "channels_last":
        xt = xt.contiguous(memory_format=torch.channels_last)
    return xt, wt, bt


def floor_fns(shape, layout, activation, seed=0, groups=GROUPS):
    """(opbridge's op, torch's F.group_norm (+ F.silu), a same-size copy) on the same input."""
    torch = torch_or_skip()
    op = opbridge_torch_op("group_norm")
    xt, wt, bt = torch_inputs(shape, layout, seed)
    F = torch.nn.functional
    if activation == "silu":
        native = lambda: F.silu(F.group_norm(xt, groups, wt, bt, EPS))  # noqa: E731
    else:
        native = lambda: F.group_norm(xt, groups, wt, bt, EPS)  # noqa: E731
    ours = lambda: op(xt, groups, wt, bt, EPS, activation)  # noqa: E731
    copy = lambda: xt.clone()  # noqa: E731  (keeps the memory format, allocates like the ops)
    return ours, native, copy


class GroupNormVsCopy:
    """time(opbridge group_norm) / time(x.clone()) in one process, float32, THREADS threads: the
    op's cost in units of the memory floor (goals in the module docstring). Lower is better."""

    params = (FLOOR_SHAPES, LAYOUTS, ACTIVATIONS)
    param_names = ["shape", "layout", "activation"]
    unit = "x copy"
    timeout = 300

    def setup(self, shape, layout, activation):
        self.ours, self.native, self.copy = floor_fns(parse_shape(shape), layout, activation)

    def track_ratio_to_copy(self, shape, layout, activation):
        # measure_speedup(a, b) = time(b) / time(a)
        return measure_speedup(self.copy, self.ours)


class TorchGroupNormVsCopy(GroupNormVsCopy):
    """The same ratio for torch's own F.group_norm (+ F.silu), for comparison."""

    def track_ratio_to_copy(self, shape, layout, activation):
        return measure_speedup(self.copy, self.native)


class GroupNormVsTorch:
    """time(F.group_norm (+ F.silu)) / time(opbridge group_norm), the two interleaved in one
    process (goal: >= 1.0 at every shape, layout and activation). Higher is better."""

    params = (FLOOR_SHAPES, LAYOUTS, ACTIVATIONS)
    param_names = ["shape", "layout", "activation"]
    unit = "x"
    timeout = 300

    def setup(self, shape, layout, activation):
        self.ours, self.native, _ = floor_fns(parse_shape(shape), layout, activation)

    def track_speedup(self, shape, layout, activation):
        return measure_speedup(self.ours, self.native)


# Channels that are no whole number of vectors (C = 12, 20, 36: rows of 48-144 bytes), 4 groups:
# channels-last rows each ended in masked loads and stores, and the op took 12-29x a copy on an
# AMD EPYC Zen 3 (AVX2) where F.group_norm took 7-11x.
ODD_CHANNEL_SHAPES = ["2x12x100x100", "2x20x64x64", "2x36x64x64"]
ODD_CHANNEL_GROUPS = 4


class _OddChannels:
    params = (ODD_CHANNEL_SHAPES, LAYOUTS, ACTIVATIONS)
    param_names = ["shape", "layout", "activation"]
    timeout = 300

    def setup(self, shape, layout, activation):
        self.ours, self.native, self.copy = floor_fns(parse_shape(shape), layout, activation,
                                                      groups=ODD_CHANNEL_GROUPS)


class GroupNormOddChannelsVsTorch(_OddChannels):
    """time(F.group_norm (+ F.silu)) / time(opbridge group_norm) at ODD_CHANNEL_SHAPES, interleaved
    in one process (goal: >= 1.0). Higher is better."""

    unit = "x"

    def track_speedup(self, shape, layout, activation):
        return measure_speedup(self.ours, self.native)


class GroupNormOddChannelsVsCopy(_OddChannels):
    """time(opbridge group_norm) / time(x.clone()) at ODD_CHANNEL_SHAPES. Lower is better."""

    unit = "x copy"

    def track_ratio_to_copy(self, shape, layout, activation):
        return measure_speedup(self.copy, self.ours)


# GroupNorm(C, C) of sequences (N, C, L): wav2vec2's feature encoder (and HuBERT's, WavLM's) on 1 s
# and 4 s of 16 kHz audio, and a batch of shorter clips. Each group is one channel of L elements,
# which starts inside a vector where L is not a multiple of 16.
SEQUENCE_SHAPES = ["1x512x3199", "4x512x3199", "8x512x799"]


class GroupNormSequenceVsCopy:
    """time(opbridge group_norm) / time(x.clone()) for GroupNorm(C, C) of (N, C, L) inputs, float32
    (goal: <= 1.10, a group fits the L2). Lower is better."""

    params = (SEQUENCE_SHAPES, ["ours", "torch"])
    param_names = ["shape", "impl"]
    unit = "x copy"
    timeout = 300

    def setup(self, shape, impl):
        dims = parse_shape(shape)
        self.ours, self.native, self.copy = floor_fns(dims, "contiguous", "none", groups=dims[1])

    def track_ratio_to_copy(self, shape, impl):
        return measure_speedup(self.copy, self.ours if impl == "ours" else self.native)


# Shapes of the backward comparison: the floor shapes that a training step meets most.
# 2x1280x8x8: the smallest level of Stable Diffusion's UNet at 512 px, where the backward is
# still slower than torch's (see the README).
BACKWARD_SHAPES = ["8x256x32x32", "2x512x64x64", "1x128x256x256", "2x1280x8x8"]


class GroupNormBackwardSpeedup:
    """Gradients (dx, dweight, dbias) of one GroupNorm (+ SiLU) through autograd, float32, THREADS
    threads: time(torch's native F.group_norm (+ F.silu)) / time(opbridge's op), side by side in
    one process. Higher is better (goal: >= 1)."""

    params = (BACKWARD_SHAPES, LAYOUTS, ACTIVATIONS)
    param_names = ["shape", "layout", "activation"]
    unit = "x"
    timeout = 300

    def setup(self, shape, layout, activation):
        torch = torch_or_skip()
        torch.set_num_threads(THREADS)
        op = opbridge_torch_op("group_norm")
        F = torch.nn.functional
        xt, wt, bt = torch_inputs(parse_shape(shape), layout)
        xt.requires_grad_(), wt.requires_grad_(), bt.requires_grad_()
        g = torch.randn_like(xt)
        y_ours = op(xt, GROUPS, wt, bt, EPS, activation)
        y_native = F.group_norm(xt, GROUPS, wt, bt, EPS)
        if activation == "silu":
            y_native = F.silu(y_native)

        def grads(y):
            return lambda: torch.autograd.grad(y, (xt, wt, bt), g, retain_graph=True)

        self.ours, self.native = grads(y_ours), grads(y_native)

    def track_speedup(self, shape, layout, activation):
        return measure_speedup(self.ours, self.native)


# Shapes of Stable Diffusion's UNet at 512 px (latents 64x64, batch 2), and a mid-size one, for
# the backward against the floor. 2x1280x8x8 (640 KB) is where fixed costs weigh most.
BACKWARD_FLOOR_SHAPES = ["2x320x64x64", "2x640x32x32", "2x1280x16x16", "2x1280x8x8", "8x256x32x32"]


class GroupNormBackwardVsCopy:
    """time(opbridge::group_norm_backward: dx and the per-channel sums) / time(x.clone()) in one
    process, float32, THREADS threads: the backward kernel's cost in units of the memory floor
    (reading x and dy once and writing dx is 1.5 copies' traffic). Lower is better."""

    params = (BACKWARD_FLOOR_SHAPES, LAYOUTS, ACTIVATIONS)
    param_names = ["shape", "layout", "activation"]
    unit = "x copy"
    timeout = 300

    def setup(self, shape, layout, activation):
        torch = torch_or_skip()
        torch.set_num_threads(THREADS)
        backward = opbridge_torch_op("group_norm_backward").default
        xt, wt, bt = torch_inputs(parse_shape(shape), layout)
        dy = torch.randn_like(xt)
        self.ours = lambda: backward(dy, xt, GROUPS, wt, bt, EPS, activation)
        self.copy = xt.clone

    def track_ratio_to_copy(self, shape, layout, activation):
        return measure_speedup(self.copy, self.ours)


class GroupNormCallOverhead:
    """The fixed cost of one call: time(F.group_norm) / time(opbridge's op) on a tiny input
    (1, 32, 1, 8), inputs without requires_grad (inference), float32. Higher is better (goal: >= 1).
    Calls that need no gradient skip the Python autograd kernel (opbridge::_no_grad_fast_path);
    through it, the op took 10.2 us and F.group_norm 6.6 us on the Xeon of docs/benchmarks.md."""

    unit = "x"

    def setup(self):
        torch = torch_or_skip()
        torch.set_num_threads(THREADS)
        op = opbridge_torch_op("group_norm")
        x, w, b = (torch.from_numpy(a).float() for a in inputs((1, GROUPS, 1, 8)))
        F = torch.nn.functional
        self.ours = lambda: op(x, GROUPS, w, b, EPS, "none")  # noqa: E731
        self.native = lambda: F.group_norm(x, GROUPS, w, b, EPS)  # noqa: E731

    def track_speedup(self):
        return measure_speedup(self.ours, self.native)
