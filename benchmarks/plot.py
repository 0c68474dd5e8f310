"""Plots time per call against problem size for every implementation of each benchmarked op
(GroupNorm, Inverse) into docs/benchmarks.png.

    python benchmarks/plot.py [--out docs/benchmarks.png] [--threads N]

Uses the same implementations as the asv suite (benchmarks/benchmarks/bench_*.py), timed here
directly over a range of sizes; implementations this build or machine cannot run are left out.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(HERE.parent / "docs" / "benchmarks.png"))
    p.add_argument("--threads", type=int, default=None, help="threads per implementation (default: all CPUs)")
    args = p.parse_args(argv)
    if args.threads is not None:
        os.environ["OPBRIDGE_BENCH_THREADS"] = str(args.threads)
    sys.path.insert(0, str(HERE))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import _common, bench_group_norm, bench_inverse

    fig, (ax_gn, ax_inv) = plt.subplots(1, 2, figsize=(13, 5))

    # GroupNorm: (2, 256, s, s), 32 groups, float32; x = tensor size in MB.
    sides = [8, 16, 24, 32, 48, 64, 96]
    for impl in bench_group_norm.IMPLS:
        xs, ys = [], []
        for s in sides:
            shape = (2, 256, s, s)
            try:
                fn = bench_group_norm.make_fn(impl, shape, "float32")
            except NotImplementedError:
                continue
            xs.append(2 * 256 * s * s * 4 / 2**20)
            ys.append(_common.measure_seconds(fn, rounds=7) * 1e6)
            print(f"group_norm {impl:28s} {shape} {ys[-1]:10.1f} us", flush=True)
        if xs:
            ax_gn.plot(xs, ys, marker="o", label=impl)
    ax_gn.set(xscale="log", yscale="log", xlabel="x size (MB, float32; shape 2x256xSxS, 32 groups)",
              ylabel="time per call (us)", title="GroupNorm")

    # Inverse: batch of n x n float32 matrices holding 2^16 elements (256 KB); x = n.
    ns = [2, 3, 4, 8, 16, 32, 64, 128, 256]
    for impl in bench_inverse.IMPLS:
        xs, ys = [], []
        for n in ns:
            shape = (max(1, 2**16 // (n * n)), n, n)
            try:
                fn = bench_inverse.make_fn(impl, shape, "float32")
            except NotImplementedError:
                continue
            xs.append(n)
            ys.append(_common.measure_seconds(fn, rounds=7) * 1e6)
            print(f"inverse    {impl:28s} {shape} {ys[-1]:10.1f} us", flush=True)
        if xs:
            ax_inv.plot(xs, ys, marker="o", label=impl)
    ax_inv.set(xscale="log", yscale="log", xlabel="n (batch of n x n float32 matrices, 2^16 elements in all)",
               ylabel="time per call (us)", title="Inverse")

    for ax in (ax_gn, ax_inv):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"opbridge CPU benchmarks: {_common.THREADS} thread(s), {platform.processor() or platform.machine()}, "
                 f"{os.cpu_count()} CPUs", fontsize=10)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
