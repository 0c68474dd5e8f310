"""Per-call overhead of the torch extension on the LibTorch stable ABI against the extension it
replaced (libtorch's C++ API, built for one torch release), alternated in one process.

    python benchmarks/stable_abi_overhead.py BASELINE_LIB [--runs 3] [--seconds 0.4]

BASELINE_LIB: the previous extension (before the stable-ABI port) built with its torch namespace
renamed to ``opbridge_base`` (scripts/build_baseline_torch.sh makes it), so that both define their
ops in one process. The baseline gets what opbridge.ops gave it: its autograd formulas, its
no-grad fast path and its C++ autograd graph (opbridge_base::_no_grad_fast_path / _cpp_autograd).
The new extension is opbridge's, as ``import opbridge.ops`` loads it: with the fast-path library
where this torch is the one it was built with (OPBRIDGE_NO_FASTPATH=1: without it, as on other
torch releases).

The smallest shapes of the asv benchmarks: GroupNorm (1, 64, 56, 56) with 32 groups, Inverse
4096 x 3 x 3, MultiScaleDeformableAttention's decoder call; float32, one thread (--threads).
Per case and run: the variants in alternating rounds, each round the median of its calls; a
variant's figure is the median over its rounds, the case's figure the median of `--runs` runs.
"Without grad": a forward with no input requiring grad. "With grad": forward and backward of a
call whose input requires grad. Prints one table (µs per call and new/old ratio).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _register_baseline(path: str) -> None:
    """The old library's Python side, as opbridge.ops registered it for namespace opbridge."""
    torch.ops.load_library(path)
    ns = torch.ops.opbridge_base

    def gn_setup(ctx, inputs, output):
        x, g, w, b, eps, act = inputs
        ctx.save_for_backward(x, w, b)
        ctx.args = (g, eps, act)

    def gn_backward(ctx, grad):
        x, w, b = ctx.saved_tensors
        g, eps, act = ctx.args
        dx, dw, db = ns.group_norm_backward.default(grad, x, g, w, b, eps, act)
        need = ctx.needs_input_grad
        return dx if need[0] else None, None, dw if need[2] else None, db if need[3] else None, None, None

    def inv_setup(ctx, inputs, output):
        ctx.save_for_backward(output)

    def inv_backward(ctx, grad):
        (y,) = ctx.saved_tensors
        yt = y.transpose(-2, -1)
        return -(yt @ grad @ yt), None

    def msda_setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def msda_backward(ctx, grad):
        v, s, st, loc, w = ctx.saved_tensors
        gv, gl, gw = ns.ms_deform_attn_backward.default(grad, v, s, st, loc, w)
        return gv, None, None, gl, gw

    for name, bwd, setup, cpp in (("group_norm", gn_backward, gn_setup, ("group_norm_backward", [0, 2, 3])),
                                  ("inverse", inv_backward, inv_setup, None),
                                  ("ms_deform_attn", msda_backward, msda_setup, ("ms_deform_attn_backward", [0, 3, 4]))):
        qual = f"opbridge_base::{name}"
        torch.library.register_autograd(qual, bwd, setup_context=setup)
        # A baseline on the stable ABI has its fast path in opbridge's fast-path library, which
        # serves any op by name.
        fp = ns if hasattr(ns, "_no_grad_fast_path") else torch.ops.opbridge
        if hasattr(fp, "_no_grad_fast_path"):
            fp._no_grad_fast_path(qual)
            if cpp is not None:
                fp._cpp_autograd(qual, f"opbridge_base::{cpp[0]}", cpp[1])


def _cases(rng):
    from benchmarks.bench_ms_deform_attn import inputs as msda_inputs

    x = torch.from_numpy(rng.standard_normal((1, 64, 56, 56)).astype(np.float32))
    w = torch.from_numpy(rng.uniform(0.5, 2, 64).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal(64).astype(np.float32))
    a = torch.from_numpy((rng.standard_normal((4096, 3, 3)) + 3 * np.eye(3)).astype(np.float32))
    value, shapes, starts, loc, aw = (torch.from_numpy(t) for t in msda_inputs("decoder", "model"))
    xg, ag, vg = x.clone().requires_grad_(), a.clone().requires_grad_(), value.clone().requires_grad_()
    gy = torch.ones_like(x)
    gm = torch.ones(2, 300, 256)

    def gn(ns, x):
        return getattr(torch.ops, ns).group_norm.default(x, 32, w, b, 1e-5, "none")

    def inv(ns, a):
        return getattr(torch.ops, ns).inverse.default(a, "raise")

    def msda(ns, v):
        return getattr(torch.ops, ns).ms_deform_attn.default(v, shapes, starts, loc, aw)

    return {
        ("GroupNorm 1x64x56x56", "no grad"): lambda ns: gn(ns, x),
        ("GroupNorm 1x64x56x56", "grad"): lambda ns: torch.autograd.grad(gn(ns, xg), xg, gy),
        ("Inverse 4096x3x3", "no grad"): lambda ns: inv(ns, a),
        ("Inverse 4096x3x3", "grad"): lambda ns: torch.autograd.grad(inv(ns, ag), ag, torch.ones_like(a)),
        ("MSDA decoder", "no grad"): lambda ns: msda(ns, value),
        ("MSDA decoder", "grad"): lambda ns: torch.autograd.grad(msda(ns, vg), vg, gm),
    }


def _round(fn, seconds: float) -> float:
    """Median µs per call of fn over about `seconds`."""
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("baseline", help="the old extension, namespace opbridge_base")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=6, help="alternating rounds per variant and run")
    ap.add_argument("--seconds", type=float, default=0.3, help="length of one round")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads (default 1: the per-call overhead, least disturbed by other "
                         "processes on the machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import opbridge.ops  # noqa: F401  (the new extension, and its fast path where it applies)

    _register_baseline(args.baseline)
    fast = hasattr(torch.ops.opbridge, "_no_grad_fast_path")
    rng = np.random.default_rng(0)
    cases = _cases(rng)
    import platform
    import subprocess

    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")),
                 platform.processor())
    print(f"# {model}, torch {torch.__version__}, {torch.get_num_threads()} threads, new library "
          f"{'with' if fast else 'without'} the fast-path library; {args.runs} runs x {args.rounds} rounds x "
          f"{args.seconds} s")
    print(f"{'case':24} {'':8} {'old µs':>9} {'new µs':>9} {'new/old':>8}")
    for (name, mode), fn in cases.items():
        for ns in ("opbridge", "opbridge_base"):  # warm-up
            _round(lambda: fn(ns), 0.1)
        ratios, olds, news = [], [], []
        for _ in range(args.runs):
            old, new = [], []
            for r in range(args.rounds):
                order = ("opbridge_base", "opbridge") if r % 2 == 0 else ("opbridge", "opbridge_base")
                for ns in order:
                    (old if ns == "opbridge_base" else new).append(_round(lambda: fn(ns), args.seconds))
            o, n = statistics.median(old), statistics.median(new)
            olds.append(o)
            news.append(n)
            ratios.append(n / o)
        print(f"{name:24} {mode:8} {statistics.median(olds):9.1f} {statistics.median(news):9.1f} "
              f"{statistics.median(ratios):8.3f}")


if __name__ == "__main__":
    main()
