"""Long fuzz runs outside pytest (the CI subset is tests/reliability/test_fuzz_ort.py / test_fuzz_torch.py).

    python -m tests.fuzz.run --cases 10000                 # every op, ORT and torch, split evenly
    python -m tests.fuzz.run --cases 2000 --kind ort --op group_norm --seed 7
    python -m tests.fuzz.run --replay fuzz-failures/<file>.pkl
    python -m tests.fuzz.run --cases 2000 --device cuda --seed 7  # torch's CUDA kernels and ORT's CUDA provider
    python -m tests.fuzz.run --cases 2000 --seed 7 --record before.jsonl   # every outcome, one line each

--record writes each case's outcome (its description, the verdict, and for a refusal the exception
type and message) as a JSON line: two builds run with the same seed give files that `diff`
compares line by line (same verdicts and messages on every case).

Every case runs in a long-lived worker process; a crash or hang is recorded with its case
(pickled under --out for --replay) and a new worker takes over, so the run always completes.
Exit status: 0 when every case passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pickle
import sys
import time
import zlib
from pathlib import Path

# Runnable from the repo root as `python -m tests.fuzz.run`; tests/fuzz/__init__.py then puts
# tests/ on sys.path for the helpers package.
from . import harness
from .ops import OPS


def derive_seed(base: int, *parts: str) -> int:
    """A stable per-(op, kind) seed from the run's base seed."""
    return zlib.crc32(":".join([str(base), *parts]).encode()) & 0xFFFFFFFF


def drive(strategy, n: int, seed: int, fn) -> None:
    """Calls fn(case) for n cases drawn from `strategy`, deterministically for a given seed."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hyp_seed

    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), print_blob=False)
    @hyp_seed(seed)
    @given(strategy)
    def body(case):
        fn(case)

    body()


def outcome(case, res) -> dict:
    """One case's outcome for --record: what a refusal said, verbatim; "ok" for a result."""
    out = {"op": case.op, "kind": case.kind, "case": case.desc, "verdict": res.verdict}
    reply = res.reply
    if isinstance(reply, tuple) and reply and reply[0] == "error":
        out["error"] = [str(reply[1]), str(reply[2])]
    elif isinstance(reply, tuple) and reply and reply[0] == "ok":
        out["result"] = "ok"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=1000, help="total number of cases (split over op x kind)")
    ap.add_argument("--kind", choices=["ort", "torch", "all"], default="all")
    ap.add_argument("--op", action="append", help="op name (repeatable); default: every op in tests/fuzz/ops")
    ap.add_argument("--seed", type=int, default=None, help="base seed (default: time-based, printed)")
    ap.add_argument("--out", type=Path, default=Path("fuzz-failures"), help="where failing cases are saved")
    ap.add_argument("--timeout", type=float, default=harness.DEFAULT_TIMEOUT_S, help="seconds before a case is a hang")
    ap.add_argument("--replay", type=Path, help="run one saved case and print the outcome")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: the torch cases' tensors on the GPU, the ORT cases on ORT's CUDA provider with "
                         "no CPU fallback (left out where onnxruntime has none); the same expectations as on the CPU")
    ap.add_argument("--record", type=Path, help="write every case's outcome to this file (JSON lines)")
    args = ap.parse_args(argv)
    if args.device == "cuda":
        os.environ["OPBRIDGE_FUZZ_DEVICE"] = "cuda"  # read by the workers (tests/fuzz/worker.py)
        if args.kind in ("all", "ort"):
            try:
                import onnxruntime

                has_cuda_ep = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
            except ImportError:
                has_cuda_ep = False
            if not has_cuda_ep:
                print("this onnxruntime has no CUDAExecutionProvider: the ORT cases are left out")
                if args.kind == "ort":
                    return 1
                args.kind = "torch"

    if args.replay:
        saved = pickle.loads(args.replay.read_bytes())
        case = saved["case"]
        print(f"replaying {case!r} (was: {saved['verdict']})")
        with harness.Worker(modules=(case.kind,), timeout_s=args.timeout) as w:
            res = harness.judge(case, w)
        print(f"verdict: {res.verdict}\n{res.detail}")
        return 0 if res.verdict == "pass" else 1

    base = args.seed if args.seed is not None else int(time.time())
    ops = args.op or sorted(OPS)
    kinds = ["ort", "torch"] if args.kind == "all" else [args.kind]
    if "torch" in kinds:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch is not installed: fuzzing the ORT ops only")
            kinds = [k for k in kinds if k != "torch"]
    jobs = [(op, kind) for op in ops for kind in kinds]
    per_job = [args.cases // len(jobs) + (1 if i < args.cases % len(jobs) else 0) for i in range(len(jobs))]
    print(f"fuzz: base seed {base} (replay the run with --seed {base}); {args.cases} cases over {jobs}"
          f" on {args.device}")

    totals = collections.Counter()
    failures = []
    record = args.record.open("w") if args.record else None
    t_start = time.monotonic()
    for (op, kind), n in zip(jobs, per_job):
        seed = derive_seed(base, op, kind)
        strategy = getattr(OPS[op], f"{kind}_cases")()
        counts = collections.Counter()
        t0 = time.monotonic()
        print(f"== {op}/{kind}: {n} cases, seed {seed}", flush=True)
        with harness.Worker(modules=(kind,), timeout_s=args.timeout) as worker:

            def one(case):
                res = harness.judge(case, worker)
                counts[res.verdict] += 1
                if record is not None:
                    record.write(json.dumps(outcome(case, res)) + "\n")
                done = sum(counts.values())
                if res.verdict != "pass":
                    path = harness.save_case(case, res, args.out)
                    failures.append((case, res, path))
                    print(f"  [{res.verdict}] {case.desc}\n    {res.detail.splitlines()[0] if res.detail else ''}\n"
                          f"    saved: {path}", flush=True)
                if done % 500 == 0:
                    print(f"  {done}/{n} cases, {dict(counts)}, {time.monotonic() - t0:.0f} s", flush=True)

            drive(strategy, n, seed, one)
            restarts = worker.restarts
        print(f"   {op}/{kind}: {sum(counts.values())} cases, {dict(counts)}, worker restarts {restarts}, "
              f"{time.monotonic() - t0:.0f} s", flush=True)
        totals.update(counts)
    elapsed = time.monotonic() - t_start
    if record is not None:
        record.close()
    print(f"fuzz total: {sum(totals.values())} cases in {elapsed:.0f} s: pass {totals['pass']}, "
          f"fail {totals['fail']}, crash {totals['crash']}, hang {totals['hang']} (base seed {base})")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
