"""Fuzzing the ORT ops, fast subset (200 cases per op): hypothesis-generated models and feeds, run
in a child worker process; each outcome must be a result equal to the float64 reference or a
clear error (tests/fuzz/oracle.py). The long run: python -m tests.fuzz.run --cases 10000."""

from __future__ import annotations

import numpy as np
import pytest

from fuzz import harness, oracle
from fuzz.ops import OPS
from fuzz.pytest_support import run_fuzz


@pytest.fixture(scope="module")
def worker():
    with harness.Worker(modules=("ort",)) as w:
        yield w


@pytest.mark.parametrize("op", sorted(OPS))
def test_fuzz_ort_op(op, worker):
    run_fuzz(OPS[op], "ort", worker)


# ---- the harness itself: crashes and hangs are caught, recorded and survived -------------------
@pytest.mark.parametrize("action,how", [("abort", "SIGABRT"), ("segfault", "SIGSEGV"), ("exit", "status 3")])
def test_harness_catches_a_crash_and_restarts(worker, action, how):
    status, detail = worker.run({"kind": "selftest", "action": action})
    if action == "segfault" and harness.under_asan():
        how = "SIGABRT"  # ASan reports the SEGV, then aborts (scripts/sanitize.sh)
    assert status == "crash" and how in detail
    # A fresh worker takes the next case.
    status, reply = worker.run({"kind": "selftest", "action": "raise"})
    assert status == "ok" and reply == ("error", "ValueError", "selftest: raise")


def test_harness_catches_a_hang():
    with harness.Worker(modules=(), timeout_s=2) as w:
        status, detail = w.run({"kind": "selftest", "action": "hang"})
        assert status == "hang" and "no reply within 2 s" in detail
        status, reply = w.run({"kind": "selftest", "action": "raise"})
        assert status == "ok" and reply[0] == "error"


def test_oracle_rejects_wrong_values_and_unclear_errors():
    ref = np.array([1.0, np.nan, np.inf, -2.0])
    exp = oracle.Ok([oracle.Expected(ref, "float32", 1e-6)])
    norm = lambda outs: [(a, a.dtype.name) for a in outs]  # noqa: E731
    good = np.array([1.0, np.nan, np.inf, -2.0], np.float32)
    assert oracle.judge(exp, ("ok", [good]), norm) is None
    for bad in ([1.001, np.nan, np.inf, -2.0], [1.0, 0.0, np.inf, -2.0], [1.0, np.nan, -np.inf, -2.0],
                [1.0, np.nan, np.inf, np.nan]):
        assert oracle.judge(exp, ("ok", [np.array(bad, np.float32)]), norm) is not None
    assert oracle.judge(exp, ("ok", [good.astype(np.float64)]), norm) is not None  # wrong dtype
    assert oracle.judge(exp, ("error", "Fail", "anything"), norm) is not None  # valid case refused
    err = oracle.Error([r"ai\.opbridge::GroupNorm: num_groups must be > 0"], why="groups")
    assert oracle.judge(err, ("error", "InvalidArgument", "x ai.opbridge::GroupNorm: num_groups must be > 0, got 0"),
                        norm) is None
    assert oracle.judge(err, ("error", "Fail", "std::bad_alloc"), norm) is not None
    assert oracle.judge(err, ("ok", [good]), norm) is not None  # invalid case accepted
    # float16 saturation: a reference beyond the range and an inf result agree.
    sat = oracle.Expected(np.array([70000.0, 65519.0]), "float16", 1.0)
    assert oracle.compare(np.array([np.inf, 65504], np.float16), sat) is None
    assert oracle.compare(np.array([60000, 65504], np.float16), sat) is not None
