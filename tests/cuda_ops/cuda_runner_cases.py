"""Cases for tests/cuda_ops/test_cuda_runner.py (not collected on its own: the file name has no test_
prefix). Each test appends "name pid" to $RUNNER_CASES_OUT, so the runner's test can tell which
ran and in which process. A sticky CUDA error is simulated by its message (the plugin knows it by
its text, as it knows torch's)."""

import os
import signal

import pytest


def _ran(name):
    with open(os.environ["RUNNER_CASES_OUT"], "a") as f:
        f.write(f"{name} {os.getpid()}\n")


def test_a_passes():
    _ran("a")


def test_b_sticky_cuda_error():
    _ran("b")
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_c_runs_in_a_fresh_process():
    _ran("c")


def test_d_dies_by_a_signal():
    _ran("d")
    os.kill(os.getpid(), signal.SIGSEGV)


def test_e_after_the_crash():
    _ran("e")


def test_f_plain_failure():
    _ran("f")
    assert 1 == 2


def test_g_skipped():
    pytest.skip("meant to be skipped")


def test_h_last():
    _ran("h")
