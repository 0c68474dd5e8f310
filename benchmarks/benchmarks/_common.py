"""Shared helpers of the opbridge asv benchmarks: thread settings, ORT sessions, in-process
speed-up measurement. (No names start with time_/track_: asv would collect them.)"""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np

# Threads for every implementation, so that ratios compare like with like: torch's intra-op
# pool and ORT's intra-op pool both get this many. Default: every CPU of the machine.
THREADS = int(os.environ.get("OPBRIDGE_BENCH_THREADS", os.cpu_count() or 1))


def _tune_malloc():
    # Fresh 4-32 MB outputs otherwise come from mmap and cost page faults on every call
    # (milliseconds in a VM), which would dominate the ops being measured. Same effect as
    # MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ in the environment.
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)
    libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)


_tune_malloc()


def torch_or_skip():
    """torch with THREADS intra-op threads, or NotImplementedError (asv: skipped)."""
    try:
        import torch
    except ImportError as e:
        raise NotImplementedError("torch is not installed") from e
    torch.set_num_threads(THREADS)
    return torch


def opbridge_torch_op(name):
    """torch.ops.opbridge.<name>, or NotImplementedError where this build lacks it."""
    torch = torch_or_skip()
    import opbridge  # noqa: F401  (registers the torch ops)

    if not hasattr(torch.ops.opbridge, name):
        raise NotImplementedError(f"torch.ops.opbridge.{name} does not exist in this build")
    return getattr(torch.ops.opbridge, name)


def ort_session(model, custom_ops=False):
    """A CPU InferenceSession with THREADS intra-op threads; NotImplementedError if ORT cannot
    load the model (e.g. an op or type it lacks)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    if custom_ops:
        import opbridge

        so.register_custom_ops_library(opbridge.get_library_path())
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT raises its own exception types (Fail, NotImplemented, ...)
        raise NotImplementedError(f"ONNX Runtime cannot run this model: {e}".splitlines()[0]) from e


ONNX_TYPES = {"float32": 1, "float16": 10, "float64": 11, "bfloat16": 16}


def ort_value(array, dtype):
    """An OrtValue holding `array` (bfloat16 given as its uint16 bit patterns)."""
    import onnxruntime as ort

    if dtype == "bfloat16":
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array, onnx_element_type=ONNX_TYPES[dtype])
    return ort.OrtValue.ortvalue_from_numpy(array)


def ort_runner(sess, feeds):
    """A no-argument callable running `sess` on pre-built OrtValues through an IOBinding, with
    outputs allocated by ORT on every run (as in a real session) and never copied to numpy: the
    cheapest way to call ORT from Python (~2 us here; sess.run adds an output copy, and
    InferenceSession.run_with_ort_values ~35 us of Python-side checks)."""
    binding = sess.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, value)
    for out in sess.get_outputs():
        binding.bind_output(out.name, "cpu")
    run = sess.run_with_iobinding

    def fn():
        run(binding)

    return fn


def numpy_to_bf16_bits(a):
    """float array -> bfloat16 bit patterns (uint16), rounded to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r


def calls_per_round(fn, min_seconds=2e-3):
    """How many calls of fn make one timing round of at least `min_seconds`."""
    fn()
    t0 = time.perf_counter()
    fn()
    dt = max(time.perf_counter() - t0, 1e-7)
    return max(1, int(min_seconds / dt))


def measure_speedup(ours, theirs, rounds=15):
    """time(theirs) / time(ours), measured side by side in this process: the two alternate
    round by round (so load changes hit both), and the median of the per-round ratios is
    returned."""
    for f in (ours, theirs):
        f()
    n_ours, n_theirs = calls_per_round(ours), calls_per_round(theirs)
    ratios = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n_ours):
            ours()
        t1 = time.perf_counter()
        for _ in range(n_theirs):
            theirs()
        t2 = time.perf_counter()
        ratios.append(((t2 - t1) / n_theirs) / ((t1 - t0) / n_ours))
    return float(np.median(ratios))


def measure_seconds(fn, rounds=15):
    """Median seconds per call of fn (for plots; asv's time_ benchmarks do their own timing)."""
    n = calls_per_round(fn)
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        ts.append((time.perf_counter() - t0) / n)
    return float(np.median(ts))
