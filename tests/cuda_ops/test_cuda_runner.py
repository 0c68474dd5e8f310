"""scripts/cuda_tests.py and its plugin (tests/helpers/cuda_isolation.py): device tests that cannot hide
each other. Checked here without a GPU, on tests/cuda_ops/cuda_runner_cases.py, whose sticky CUDA error is
simulated by its message and whose crash is a real SIGSEGV."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_runner_isolates_and_reports_the_first_failure_first(tmp_path):
    out = tmp_path / "ran.txt"
    log = tmp_path / "log.jsonl"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "cuda_tests.py"), "--log", str(log), "--",
                        "tests/cuda_ops/cuda_runner_cases.py"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "RUNNER_CASES_OUT": str(out)})
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    ran = [line.split() for line in out.read_text().splitlines()]
    names = [n for n, _ in ran]
    # Every test ran once, in order, though two of them ended their process.
    assert names == ["a", "b", "c", "d", "e", "f", "h"]
    pid = dict(ran)
    assert pid["a"] == pid["b"] != pid["c"] == pid["d"] != pid["e"] == pid["f"] == pid["h"]
    report = r.stdout[r.stdout.index("===== report ====="):]
    assert report.splitlines()[1] == "FIRST FAILURE: tests/cuda_ops/cuda_runner_cases.py::test_b_sticky_cuda_error"
    failed = [line.split()[1] for line in report.splitlines() if line.startswith("FAILED ")]
    assert failed == ["tests/cuda_ops/cuda_runner_cases.py::test_b_sticky_cuda_error",
                      "tests/cuda_ops/cuda_runner_cases.py::test_d_dies_by_a_signal",
                      "tests/cuda_ops/cuda_runner_cases.py::test_f_plain_failure"]
    assert "the process was ended after it" in report.split("test_b_sticky_cuda_error")[2].splitlines()[0]
    assert "SKIPPED x1: meant to be skipped" in report
    assert "4 passed, 3 failed, 1 skipped, 1 crashed processes" in report
