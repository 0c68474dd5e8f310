"""Concurrency: one ORT session run from many threads, several sessions (each registering the
library) in parallel, and the torch ops from several threads. Every result must be bit-identical
to the same computation done alone: the kernels' reductions never depend on how work is split
over threads."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest

import opbridge
from helpers.onnx_models import single_node_model
from helpers.reference import group_norm as ref_group_norm


def _gn_model(dtype, c, groups, eps=1e-5):
    return single_node_model("GroupNorm", "ai.opbridge",
                             [("X", dtype, ["N", c, "H", "W"]), ("scale", dtype, [c]), ("bias", dtype, [c])],
                             {"num_groups": groups, "epsilon": eps}).SerializeToString()


def _session(model, threads=2):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return opbridge.InferenceSession(model, sess_options=so)


def _feeds(rng, dtype, shape):
    c = shape[1]
    return {"X": (rng.standard_normal(shape) * 3 + 1).astype(dtype),
            "scale": rng.uniform(0.5, 2, c).astype(dtype), "bias": rng.standard_normal(c).astype(dtype)}


def _run_threads(n_threads, fn):
    """Runs fn(i) on n_threads threads started together; re-raises the first failure."""
    barrier = threading.Barrier(n_threads)

    def wrapped(i):
        barrier.wait()
        return fn(i)

    with ThreadPoolExecutor(n_threads) as pool:
        return [f.result() for f in [pool.submit(wrapped, i) for i in range(n_threads)]]


def _bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _one_session_many_threads(rng, n_threads, runs, shape):
    sess = _session(_gn_model(np.float32, shape[1], 8))
    # Each thread has its own input, so a result leaking between threads is caught too.
    feeds = [_feeds(rng, np.float32, shape) for _ in range(n_threads)]
    expected = [sess.run(None, f)[0] for f in feeds]
    for f, e in zip(feeds, expected):
        ref = ref_group_norm(f["X"], 8, f["scale"], f["bias"], 1e-5)
        np.testing.assert_allclose(e, ref, rtol=2e-5, atol=2e-5)

    def work(i):
        bad = 0
        for _ in range(runs):
            bad += not _bits_equal(sess.run(None, feeds[i])[0], expected[i])
        return bad

    assert _run_threads(n_threads, work) == [0] * n_threads


def test_one_session_8_threads_x_1000_runs_bit_identical(rng):
    _one_session_many_threads(rng, 8, 1000, (2, 32, 8, 8))


@pytest.mark.slow
def test_one_session_16_threads_x_5000_runs_large_inputs(rng):
    _one_session_many_threads(rng, 16, 5000, (4, 64, 32, 32))


def _several_sessions(rng, n_sessions, runs):
    configs = [(np.float32, 16, 4), (np.float64, 12, 3), (np.float16, 8, 2), (np.float32, 32, 32)]
    specs = [configs[i % len(configs)] for i in range(n_sessions)]
    feeds = [_feeds(rng, dt, (2, c, 6, 5)) for dt, c, _ in specs]

    def work(i):
        # Every thread registers the library on its own options and builds its own session,
        # concurrently with the others.
        dt, c, g = specs[i]
        sess = _session(_gn_model(dt, c, g), threads=1)
        first = sess.run(None, feeds[i])[0]
        same = all(_bits_equal(sess.run(None, feeds[i])[0], first) for _ in range(runs))
        return first, same

    results = _run_threads(n_sessions, work)
    for (dt, c, g), f, (first, same) in zip(specs, feeds, results):
        assert same
        tol = {np.float32: 2e-5, np.float64: 1e-12, np.float16: 4e-3}[dt]
        # The model's epsilon attribute is a float32 (ONNX float attributes are).
        ref = ref_group_norm(f["X"], g, f["scale"], f["bias"], eps=float(np.float32(1e-5)))
        np.testing.assert_allclose(first.astype(np.float64), ref, rtol=tol, atol=tol)


def test_several_sessions_registered_in_parallel(rng):
    _several_sessions(rng, 8, 200)


@pytest.mark.slow
def test_many_sessions_registered_in_parallel_long(rng):
    _several_sessions(rng, 32, 2000)


# ---- torch -----------------------------------------------------------------------------------
def _torch_threads(rng, n_threads, calls):
    torch = pytest.importorskip("torch")
    shapes = [(2, 16, 7, 9), (3, 8, 33), (1, 32, 16, 16)]
    inputs = []
    for i in range(n_threads):
        shape = shapes[i % len(shapes)]
        c = shape[1]
        x = torch.from_numpy(rng.standard_normal(shape) * 2 + 0.5).float()
        w = torch.from_numpy(rng.uniform(0.5, 2, c)).float()
        b = torch.from_numpy(rng.standard_normal(c)).float()
        dy = torch.from_numpy(rng.standard_normal(shape)).float()
        inputs.append((x, w, b, dy))

    def once(i):
        x, w, b, dy = (t.clone() for t in inputs[i])
        x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
        y = opbridge.ops.group_norm(x, 4, w, b, 1e-5)
        y.backward(dy)
        return [t.detach().numpy().copy() for t in (y, x.grad, w.grad, b.grad)]

    expected = [once(i) for i in range(n_threads)]
    for (x, w, b, _), (y, *_rest) in zip(inputs, expected):
        np.testing.assert_allclose(y, ref_group_norm(x.double().numpy(), 4, w.double().numpy(), b.double().numpy()),
                                   rtol=2e-5, atol=2e-5)

    def work(i):
        return sum(not all(_bits_equal(a, e) for a, e in zip(once(i), expected[i])) for _ in range(calls))

    assert _run_threads(n_threads, work) == [0] * n_threads


@pytest.mark.torch
def test_torch_op_forward_backward_from_8_threads(rng):
    _torch_threads(rng, 8, 100)


@pytest.mark.torch
@pytest.mark.slow
def test_torch_op_from_16_threads_long(rng):
    _torch_threads(rng, 16, 2000)


# ---- Inverse -------------------------------------------------------------------------------------
def test_inverse_one_session_8_threads_bit_identical(rng):
    model = single_node_model("Inverse", "ai.opbridge", [("X", np.float64, ["B", 12, 12])]).SerializeToString()
    sess = _session(model)
    # Well-conditioned batches (diagonally dominant), one per thread.
    feeds = [{"X": rng.standard_normal((16, 12, 12)) + 24 * np.eye(12)} for _ in range(8)]
    expected = [sess.run(None, f)[0] for f in feeds]
    for f, e in zip(feeds, expected):
        np.testing.assert_allclose(e, np.linalg.inv(f["X"]), rtol=1e-12, atol=1e-14)

    def work(i):
        return sum(not _bits_equal(sess.run(None, feeds[i])[0], expected[i]) for _ in range(300))

    assert _run_threads(8, work) == [0] * 8
