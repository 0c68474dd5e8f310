"""Batched matrix inverse on the CPU: opbridge (torch op and ORT custom op) against
torch.linalg.inv and ONNX Runtime's com.microsoft Inverse. The opbridge implementations are
skipped where this build has no Inverse op."""

from __future__ import annotations

import numpy as np
from onnx import helper

from ._common import (
    ONNX_TYPES,
    THREADS,
    measure_speedup,
    opbridge_torch_op,
    ort_runner,
    ort_session,
    ort_value,
    torch_or_skip,
)

# batch x n x n: many tiny matrices (3x3: geometry; 8x8: small filters / covariance), then
# sizes where blocked elimination matters.
SHAPES = ["4096x3x3", "1024x8x8", "64x64x64", "8x256x256"]
DTYPES = ["float32"]
IMPLS = ["opbridge-torch", "torch-native", "opbridge-ort", "ort-com.microsoft"]
IR_VERSION = 10
# torch 2.13's CPU torch.linalg.inv with more than one thread gives wrong results or hangs for
# n >~ 150 with batch >= 2 (MKL; pytorch issues 142815 / 141358): not run there.
TORCH_INV_MAX_N_MULTITHREADED = 128


def parse_shape(s):
    return tuple(int(d) for d in s.split("x"))


def inputs(shape, seed=0):
    """Well-conditioned random matrices (float64): standard normal plus sqrt(n) on the diagonal."""
    rng = np.random.default_rng(seed)
    n = shape[-1]
    return rng.standard_normal(shape) + np.sqrt(n) * np.eye(n)


def model(shape, dtype, domain):
    t = ONNX_TYPES[dtype]
    node = helper.make_node("Inverse", ["X"], ["Y"], domain=domain)
    graph = helper.make_graph([node], "inverse", [helper.make_tensor_value_info("X", t, shape)],
                              [helper.make_tensor_value_info("Y", t, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)],
                             ir_version=IR_VERSION)


def make_fn(impl, shape, dtype, seed=0):
    """A no-argument callable inverting a fixed batch with implementation `impl`;
    NotImplementedError where that implementation cannot run here."""
    x = inputs(shape, seed)
    if impl in ("opbridge-torch", "torch-native"):
        torch = torch_or_skip()
        xt = torch.from_numpy(x).to(getattr(torch, dtype))
        if impl == "opbridge-torch":
            op = opbridge_torch_op("inverse")
            return lambda: op(xt)
        if THREADS > 1 and shape[-1] > TORCH_INV_MAX_N_MULTITHREADED and len(shape) > 2 and shape[0] > 1:
            raise NotImplementedError("torch.linalg.inv is unreliable here with more than one thread (MKL)")
        inv = torch.linalg.inv
        return lambda: inv(xt)
    domain = {"opbridge-ort": "ai.opbridge", "ort-com.microsoft": "com.microsoft"}[impl]
    sess = ort_session(model(shape, dtype, domain), custom_ops=impl == "opbridge-ort")
    fn = ort_runner(sess, {"X": ort_value(x.astype(dtype), dtype)})
    try:
        fn()
    except Exception as e:
        raise NotImplementedError(f"{impl} fails: {e}".splitlines()[0]) from e
    return fn


class Inverse:
    """Time per call of each implementation (THREADS threads, see _common.py)."""

    params = (SHAPES, DTYPES, IMPLS)
    param_names = ["shape", "dtype", "impl"]
    warmup_time = 0.2

    def setup(self, shape, dtype, impl):
        self.fn = make_fn(impl, parse_shape(shape), dtype)

    def time_inverse(self, shape, dtype, impl):
        self.fn()


COMPARISONS = {
    "opbridge-ort/ort-com.microsoft": ("opbridge-ort", "ort-com.microsoft"),
    "opbridge-ort/torch-native": ("opbridge-ort", "torch-native"),
    "opbridge-torch/ort-com.microsoft": ("opbridge-torch", "ort-com.microsoft"),
    "opbridge-torch/torch-native": ("opbridge-torch", "torch-native"),
}


class InverseSpeedup:
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
