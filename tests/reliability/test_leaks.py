"""Leaks and repeated registration: create/run/destroy cycles of sessions with the library
registered keep the resident set bounded; registering the library twice on one SessionOptions,
or on many, is safe. RSS numbers are printed (pytest -s) for the record."""

from __future__ import annotations

import ctypes
import gc
import os
import sys

import numpy as np
import onnxruntime as ort
import pytest

import opbridge
from fuzz import harness, oracle
from helpers.onnx_models import single_node_model
from helpers.reference import group_norm as ref_group_norm

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS is read from /proc (Linux)")
# Under AddressSanitizer freed memory sits in a quarantine: RSS then says nothing about leaks.
rss_test = pytest.mark.skipif(harness.under_asan(), reason="ASan's quarantine holds freed memory; RSS is meaningless")

# Leak detection by RSS, in two consecutive phases of the same number of cycles after a warm-up:
# a leak grows RSS in every phase by about cycles x (bytes leaked per cycle), while the allocator's
# own settling (an arena grown once, a cache filled once) shows in one phase, not in both. So the
# smaller of the two phases' growths is compared with the threshold. Measured here (min over the
# two phases): <= 0.3 MiB for 500 session cycles or 1000 failing runs; a single phase spiked to
# 1 MiB. MAX_LEAK_PER_CYCLE = 2 KiB makes the threshold 1 MiB per 500 cycles, so a leaked session
# (hundreds of KiB), input tensor or output (16 KiB here) per cycle fails by a wide margin.
# Smaller leaks (a few bytes of a kernel object) are below RSS noise: LeakSanitizer finds those
# (scripts/sanitize.sh).
MAX_LEAK_PER_CYCLE = 2 << 10


def _rss() -> int:
    gc.collect()
    try:
        # Hand freed heap back to the OS so that RSS counts live memory only.
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


MODEL = single_node_model("GroupNorm", "ai.opbridge",
                          [("X", np.float32, ["N", 16, "S"]), ("scale", np.float32, [16]), ("bias", np.float32, [16])],
                          {"num_groups": 4}).SerializeToString()


def _cycle(feeds, register=1):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    for _ in range(register):
        so.register_custom_ops_library(opbridge.get_library_path())
    sess = ort.InferenceSession(MODEL, sess_options=so, providers=["CPUExecutionProvider"])
    y = sess.run(None, feeds)[0]
    del sess, so
    return y


def _feeds(rng):
    return {"X": rng.standard_normal((4, 16, 64)).astype(np.float32),
            "scale": rng.uniform(0.5, 2, 16).astype(np.float32), "bias": rng.standard_normal(16).astype(np.float32)}


def _measure(fn, warmup, cycles):
    """RSS growth in bytes over two consecutive phases of `cycles` calls each, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    rss = [_rss()]
    for _ in range(2):
        for _ in range(cycles):
            fn()
        rss.append(_rss())
    return rss[1] - rss[0], rss[2] - rss[1]


def _check(what, growth, cycles):
    first, second = growth
    print(f"{what}: RSS growth {first / 2**10:+.0f} KiB, then {second / 2**10:+.0f} KiB over two phases of "
          f"{cycles} cycles ({min(first, second) / cycles:+.0f} B/cycle in the smaller)")
    assert min(first, second) < cycles * MAX_LEAK_PER_CYCLE, (
        f"{what}: RSS grew by {first / 2**10:.0f} KiB and then {second / 2**10:.0f} KiB over two phases of "
        f"{cycles} cycles, i.e. >= {min(first, second) / cycles:.0f} B per cycle in both (a leak)")


@rss_test
def test_session_create_run_destroy_cycles_do_not_leak(rng):
    feeds = _feeds(rng)
    expected = ref_group_norm(feeds["X"], 4, feeds["scale"], feeds["bias"])
    np.testing.assert_allclose(_cycle(feeds), expected, rtol=2e-5, atol=2e-5)
    _check("create/run/destroy", _measure(lambda: _cycle(feeds), warmup=100, cycles=500), 500)


@rss_test
def test_runs_on_one_session_rss_bounded(rng):
    feeds = _feeds(rng)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = opbridge.InferenceSession(MODEL, sess_options=so)
    _check("runs on one session", _measure(lambda: sess.run(None, feeds), warmup=200, cycles=2500), 2500)


@rss_test
def test_failing_runs_do_not_leak(rng):
    # Every run fails validation (wrong scale length): the error path must free what it made.
    feeds = _feeds(rng)
    feeds["scale"] = feeds["scale"][:5]
    model = single_node_model("GroupNorm", "ai.opbridge", [("X", np.float32, None), ("scale", np.float32, None),
                                                           ("bias", np.float32, None)], {"num_groups": 4})
    ort.set_default_logger_severity(4)  # the failures are expected; keep the log quiet
    try:
        sess = opbridge.InferenceSession(model.SerializeToString())

        def fail_once():
            with pytest.raises(Exception, match="weight must have C = 16 elements"):
                sess.run(None, feeds)

        growth = _measure(fail_once, warmup=100, cycles=1000)
    finally:
        ort.set_default_logger_severity(2)
    _check("failing runs", growth, 1000)


@rss_test
@pytest.mark.parametrize("on_singular", ["raise", "nan"])
def test_inverse_runs_with_singular_matrices_do_not_leak(rng, on_singular):
    # A batch with a singular matrix: an error per run ("raise") or NaN for it ("nan").
    x = rng.standard_normal((64, 5, 5)).astype(np.float32)
    x[17, 3] = 0.0
    attrs = {"on_singular": on_singular} if on_singular != "raise" else {}
    model = single_node_model("Inverse", "ai.opbridge", [("X", np.float32, None)], attrs, domain_version=2)
    ort.set_default_logger_severity(4)
    try:
        sess = opbridge.InferenceSession(model.SerializeToString())

        def once():
            if on_singular == "nan":
                assert np.isnan(sess.run(None, {"X": x})[0][17]).all()
            else:
                with pytest.raises(Exception, match="matrix 17 of the batch is singular"):
                    sess.run(None, {"X": x})

        growth = _measure(once, warmup=100, cycles=1000)
    finally:
        ort.set_default_logger_severity(2)
    _check(f"Inverse runs (on_singular={on_singular})", growth, 1000)


@pytest.mark.torch
@rss_test
def test_torch_op_forward_backward_rss_bounded(rng):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(rng.standard_normal((4, 16, 64))).float().requires_grad_()
    w = torch.from_numpy(rng.uniform(0.5, 2, 16)).float().requires_grad_()

    def once():
        opbridge.ops.group_norm(x, 4, w, None, 1e-5).sum().backward()
        x.grad = w.grad = None

    _check("torch forward+backward", _measure(once, warmup=100, cycles=1000), 1000)


# ---- registration ------------------------------------------------------------------------------
def _ort_case(rng, register):
    """A GroupNorm case for the fuzz worker: runs in a child process, so that a crash in
    registration is reported instead of taking the test run down."""
    feeds = _feeds(rng)
    ref = ref_group_norm(feeds["X"], 4, feeds["scale"], feeds["bias"])
    return {"kind": "ort", "model": MODEL, "feeds": feeds, "threads": 1, "register": register}, ref


@pytest.fixture(scope="module")
def worker():
    with harness.Worker(modules=("ort",)) as w:
        yield w


@pytest.mark.parametrize("times", [2, 3])
def test_registering_twice_on_one_session_options_is_safe(rng, worker, times):
    # Run in the worker process: ORT versions that crash on a duplicate domain would take the
    # test run down otherwise. Registration is idempotent (tests/ort/test_ort_runtime.py checks it
    # in-process too).
    payload, ref = _ort_case(rng, times)
    status, reply = worker.run(payload)
    assert status == "ok" and reply[0] == "ok", f"registering {times} times: {status}: {reply}"
    assert oracle.compare(reply[1][0], oracle.Expected(ref, "float32", 2e-5)) is None


@rss_test
def test_registering_twice_per_cycle_rss_bounded(rng):
    # Each cycle: new options, the library registered twice (the second is a no-op), a session,
    # a run. Nothing per registration may pile up.
    feeds = _feeds(rng)
    _check("registering twice per cycle", _measure(lambda: _cycle(feeds, register=2), warmup=100, cycles=500), 500)


def test_registering_on_many_session_options(rng):
    feeds = _feeds(rng)
    expected = ref_group_norm(feeds["X"], 4, feeds["scale"], feeds["bias"])
    sessions = []
    for _ in range(200):
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.register_custom_ops_library(opbridge.get_library_path())
        sessions.append(ort.InferenceSession(MODEL, sess_options=so, providers=["CPUExecutionProvider"]))
    for sess in sessions:
        np.testing.assert_allclose(sess.run(None, feeds)[0], expected, rtol=2e-5, atol=2e-5)
    del sessions
    if not harness.under_asan():
        _check("registering on more options", _measure(lambda: _cycle(feeds), warmup=20, cycles=300), 300)
