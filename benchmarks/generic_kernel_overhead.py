"""Per-call cost of opbridge's generic torch kernel against a torch adapter written by hand, for
the same op and kernel, alternated in one process.

    python benchmarks/generic_kernel_overhead.py [--dir DIR] [--rounds 9]

Builds (once, into DIR, default ./build/generic_overhead) two projects of the op `scaled_mul`
(y = alpha * x * weight): `newproj`, as `opbridge new-op` makes it today (a compute function run
by the generic kernel), and `oldproj`, the same scaffold with the op files of an earlier new-op
(tests/fixtures/adapter_project: torch and ORT adapters written by hand). Both are built against
the installed opbridge, so they share its declaration code. Prints µs per call (median of the
rounds) of each, the median of the rounds' generic/hand-written ratios, and a same-size copy
(`y.copy_(x)`, the memory floor) measured alongside; float32, one thread, no grad.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(dir: Path) -> Path:
    site = dir / "site"
    if (site / "newproj").is_dir() and (site / "oldproj").is_dir():
        return site
    from opbridge._newop import new_op

    shutil.rmtree(dir, ignore_errors=True)
    for name in ("newproj", "oldproj"):
        project = new_op("scaled_mul", dir=dir / name, namespace=name).dir
        if name == "oldproj":
            fixture = ROOT / "tests" / "fixtures" / "adapter_project"
            shutil.rmtree(project / "ops" / "scaled_mul")
            shutil.copytree(fixture / "ops" / "scaled_mul", project / "ops" / "scaled_mul")
            shutil.copy(fixture / "python" / "scaled_mul.py", project / "python" / name / "ops" / "scaled_mul.py")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
                        "--target", str(site), f"-Cbuild-dir={dir / ('build_' + name)}", str(project)], check=True)
    return site


def per_call(f, n: int) -> float:
    t = time.perf_counter_ns()
    for _ in range(n):
        f()
    return (time.perf_counter_ns() - t) / n / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=ROOT / "build" / "generic_overhead")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    sys.path.insert(0, str(build(args.dir.resolve())))
    import torch

    import newproj.ops  # noqa: F401  (the torch side: extension, fake kernels, autograd)
    import oldproj.ops  # noqa: F401

    torch.set_num_threads(1)
    print("shape        hand-written   generic   generic/hand   copy (µs per call)")
    for shape in [(4, 8), (64, 256), (1024, 1024)]:
        x, w = torch.randn(*shape), torch.randn(shape[-1])
        y = torch.empty_like(x)
        fns = {"old": lambda: torch.ops.oldproj.scaled_mul(x, w, 0.5),
               "new": lambda: torch.ops.newproj.scaled_mul(x, w, 0.5), "copy": lambda: y.copy_(x)}
        torch.testing.assert_close(fns["old"](), fns["new"]())
        n = max(200, int(2e6 // x.numel()))
        for f in fns.values():
            per_call(f, n)
        rounds = {k: [] for k in fns}
        for _ in range(args.rounds):
            for k, f in fns.items():
                rounds[k].append(per_call(f, n))
        med = {k: statistics.median(v) for k, v in rounds.items()}
        ratio = statistics.median(a / b for a, b in zip(rounds["new"], rounds["old"]))
        print(f"{str(shape):12} {med['old']:12.2f} {med['new']:9.2f} {ratio:14.3f} {med['copy']:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
