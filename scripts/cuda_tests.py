#!/usr/bin/env python3
"""Runs device tests so that one cannot hide another (see tests/helpers/cuda_isolation.py).

    python scripts/cuda_tests.py [--log FILE] [--junit-prefix P] -- [pytest args: paths, -k, -m ...]

pytest runs with the isolation plugin: after every test the device is synchronized, and a test
that leaves a CUDA error (sticky: every later CUDA call would fail with it) ends the process. A
process that ends that way, or dies by a signal, is started again after the test that was
running, until every collected test has run. The report names the first failure first, then
every failure in the order the tests ran, then the totals; the exit status is 0 only when no
test failed or crashed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from helpers.cuda_isolation import FATAL_EXIT, LOG_ENV, RESUME_ENV  # noqa: E402

MAX_RESTARTS = 200


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut short by a process that died while writing it
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, default=Path("cuda-tests.jsonl"), help="the per-test log (JSON lines)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    pytest_args = [a for a in args.pytest_args if a != "--"]
    log = args.log.resolve()
    log.unlink(missing_ok=True)

    env = dict(os.environ)
    env[LOG_ENV] = str(log)
    env["PYTHONPATH"] = str(ROOT / "tests") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop(RESUME_ENV, None)
    crashed: list[tuple[str, str]] = []  # (nodeid, why) for processes that ended inside a test
    start = time.time()
    for run in range(MAX_RESTARTS):
        before = len(read_log(log))
        cmd = [args.python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "helpers.cuda_isolation",
               *pytest_args]
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        records = read_log(log)[before:]
        started = [r["nodeid"] for r in records if r["event"] == "start"]
        if rc in (0, 1, 5) or not started:
            break  # the run finished (passed, failed, nothing collected) or never reached a test
        last = started[-1]
        fatal = [r for r in records if r["event"] == "fatal"]
        if rc == FATAL_EXIT and fatal:
            print(f"\n[cuda_tests] CUDA error in {last}: process ended, resuming after it", flush=True)
        else:
            why = f"the process ended with status {rc} during the test"
            crashed.append((last, why))
            print(f"\n[cuda_tests] {last}: {why}; resuming after it", flush=True)
        env[RESUME_ENV] = last
    else:
        print(f"[cuda_tests] gave up after {MAX_RESTARTS} restarts", flush=True)
        return 2

    # One outcome per test: the worst of its phases; crashed tests that logged no outcome fail.
    order: list[str] = []
    outcome: dict[str, tuple[str, str, bool]] = {}
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    for r in read_log(log):
        if r["event"] == "start":
            if r["nodeid"] not in outcome:
                order.append(r["nodeid"])
                outcome[r["nodeid"]] = ("passed", "", False)
        elif r["event"] in ("setup", "call", "teardown"):
            prev = outcome.get(r["nodeid"], ("passed", "", False))
            out = r["outcome"]
            if r["event"] == "setup" and out == "passed":
                continue
            if rank[out] >= rank[prev[0]]:
                outcome[r["nodeid"]] = (out, r.get("message", ""), r.get("fatal", False) or prev[2])
    for nodeid, why in crashed:
        if outcome.get(nodeid, ("passed",))[0] != "failed":
            outcome[nodeid] = ("failed", why, True)

    failures = [n for n in order if outcome[n][0] == "failed"]
    counts = {k: sum(1 for n in order if outcome[n][0] == k) for k in ("passed", "failed", "skipped")}
    print("\n[cuda_tests] ===== report =====")
    if failures:
        first = failures[0]
        print(f"FIRST FAILURE: {first}\n    {outcome[first][1]}")
        for n in failures:
            tag = " (CUDA error: the process was ended after it)" if outcome[n][2] else ""
            print(f"FAILED {n}{tag}\n    {outcome[n][1]}")
    skips: dict[str, int] = {}
    for n in order:
        if outcome[n][0] == "skipped":
            skips[outcome[n][1]] = skips.get(outcome[n][1], 0) + 1
    for reason, k in sorted(skips.items(), key=lambda kv: -kv[1]):
        print(f"SKIPPED x{k}: {reason}")
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, "
          f"{len(crashed)} crashed processes, {time.time() - start:.0f} s (log: {log})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
