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
# ORT's intra-op workers spin-wait for more work after each parallel section (ORT's default,
# kept here: it is what users get). OPBRIDGE_BENCH_ORT_SPIN=0 turns it off for every ORT session.
ORT_SPIN = os.environ.get("OPBRIDGE_BENCH_ORT_SPIN", "1") == "1"
# Pause before timing an implementation after another one ran: ORT's idle workers spin for
# about 10-15 ms, torch's OpenMP threads for up to ~1 ms. Timed while the other's threads still
# spin, a call competes with them for the CPUs (a torch call that takes 30 us can then wait
# milliseconds at an OpenMP barrier when there are as many threads as CPUs).
SETTLE_SECONDS = 0.03


def _asv_quick() -> bool:
    """Whether this runs under `asv run --quick` (an ancestor process's command line says so: asv
    tells benchmarks nothing of it); OPBRIDGE_BENCH_QUICK=1 / 0 decides instead. Quick runs are
    smoke tests: speed-ups are then measured in one round of few calls (noisy figures), so that
    the model benchmarks, whose calls take seconds on 2 cores, finish in minutes."""
    env = os.environ.get("OPBRIDGE_BENCH_QUICK")
    if env is not None:
        return env == "1"
    pid = os.getppid()
    for _ in range(32):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if any(os.path.basename(a) in (b"asv", b"asv.exe") for a in args[:2]) and (b"--quick" in args or b"-q" in args):
            return True
        if parent <= 1:
            return False
        pid = parent
    return False


QUICK = _asv_quick()


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
    import opbridge.ops  # noqa: F401  (registers the torch ops)

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
    if not ORT_SPIN:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
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


def warm_up(fn, seconds=0.1, min_calls=5):
    """Calls fn for a while first: the first calls of a fresh process fault in the pages of new
    outputs (milliseconds for a few MB) and start thread pools."""
    t_end = time.perf_counter() + seconds
    for i in range(10**6):
        fn()
        if i + 1 >= min_calls and time.perf_counter() > t_end:
            break


def calls_per_round(fn, min_seconds=2e-3):
    """How many calls of fn make one timing round of at least `min_seconds`."""
    t0 = time.perf_counter()
    fn()
    dt = max(time.perf_counter() - t0, 1e-7)
    return max(1, int(min_seconds / dt))


def measure_speedup(ours, theirs, rounds=9, round_seconds=0.01):
    """time(theirs) / time(ours), measured side by side in this process: the two alternate
    round by round (so load changes hit both alike), and the median of the per-round ratios is
    returned. Each round starts after SETTLE_SECONDS and a few milliseconds of untimed calls,
    so that an implementation is timed in its steady state (its own thread pool awake, its data
    back in cache) and not while the other's threads still spin."""

    def timed(fn, n):
        time.sleep(SETTLE_SECONDS)
        warm_up(fn, seconds=round_seconds / 2, min_calls=1 if QUICK else 2)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    if QUICK:
        rounds, round_seconds = 1, 0.0
    warm_up(ours, min_calls=1 if QUICK else 5)
    warm_up(theirs, min_calls=1 if QUICK else 5)
    n_ours, n_theirs = calls_per_round(ours, round_seconds), calls_per_round(theirs, round_seconds)
    ratios = []
    for r in range(rounds):
        # Alternate which goes first, in case the order matters.
        if r % 2 == 0:
            t_ours = timed(ours, n_ours)
            t_theirs = timed(theirs, n_theirs)
        else:
            t_theirs = timed(theirs, n_theirs)
            t_ours = timed(ours, n_ours)
        ratios.append(t_theirs / t_ours)
    return round(float(np.median(ratios)), 3)


def measure_seconds(fn, rounds=15):
    """Median seconds per call of fn (for plots; asv's time_ benchmarks do their own timing)."""
    warm_up(fn)
    time.sleep(SETTLE_SECONDS)
    fn()
    n = calls_per_round(fn)
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        ts.append((time.perf_counter() - t0) / n)
    return float(np.median(ts))
