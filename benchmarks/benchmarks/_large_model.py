"""A real-size model for memory and time measurements of export and optimize, and the child
process that exports it (bench_large_models.py and tests/test_large_models.py run it).

The model: N_PARAMS distinct torch.randn weights (d x d, together about GB gigabytes), each a
MatMul of a (batch, d) activation followed by Tanh, and BLOCKS GroupNorm(8, 32) + SiLU blocks on a
(batch, 32, 1, d / 32) view in between (what opbridge's fusion rewrites). The weights dominate its
memory; its compute is small (batch x d x d per weight), so that times measure the files and the
tensors, not arithmetic.

As a program: ``python _large_model.py export --gb 2.2 --variant opbridge --dynamo 1 --out m.onnx``
builds the model and exports it with ``torch.onnx.export`` (``--variant torch``) or
``opbridge.onnx.export`` (``--variant opbridge``) and prints one JSON line: the wall time of the
export call. ``--reference DIR`` also writes an example input and torch's output for it there
(before the export). Peak memory is measured by the parent (``run_measured``: ru_maxrss of the
child from wait4), so that the child's own bookkeeping adds nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time

N_PARAMS = 64
BLOCKS = 2
CHANNELS, GROUPS = 32, 8
SEED = 0


def dims_for(gb: float, n_params: int = N_PARAMS, itemsize: int = 4) -> int:
    """The side d of each square weight for a model of about ``gb`` (1e9 bytes), a multiple of
    CHANNELS (the GroupNorm view needs it)."""
    return int(math.sqrt(gb * 1e9 / n_params / itemsize)) // CHANNELS * CHANNELS


def build(gb: float, dtype: str = "float32", n_params: int = N_PARAMS, blocks: int = BLOCKS, seed: int = SEED):
    """(model in eval mode, (example input,)); the same weights for the same arguments."""
    import torch

    dt = getattr(torch, dtype)
    d = dims_for(gb, n_params, torch.empty((), dtype=dt).element_size())
    every = max(1, n_params // (blocks + 1))

    class Large(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            gen = torch.Generator().manual_seed(seed)
            self.weights = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.randn(d, d, generator=gen, dtype=dt)) for _ in range(n_params)])
            self.norms = torch.nn.ModuleList([torch.nn.GroupNorm(GROUPS, CHANNELS, dtype=dt) for _ in range(blocks)])
            with torch.no_grad():  # not the identity affine, so that a wrong scale or bias shows
                for gn in self.norms:
                    gn.weight.copy_(torch.rand(CHANNELS, generator=gen) + 0.5)
                    gn.bias.copy_(torch.rand(CHANNELS, generator=gen) - 0.5)

        def forward(self, x):
            h, k = x, 0
            for i, w in enumerate(self.weights):
                h = (h @ w) * (1.0 / math.sqrt(d))
                if (i + 1) % every == 0 and k < len(self.norms):
                    n = h.shape[0]
                    # Tanh on the 4-D view, so that the GroupNorm's input is a value of its own
                    # (the exporters fold a Reshape straight into GroupNorm's grouping Reshape).
                    v = torch.tanh(h.reshape(n, CHANNELS, 1, d // CHANNELS))
                    h = torch.nn.functional.silu(self.norms[k](v)).reshape(n, d)
                    k += 1
                else:
                    h = torch.tanh(h)
            return h

    gen = torch.Generator().manual_seed(seed + 1)
    return Large().eval(), (torch.randn(2, d, generator=gen, dtype=dt),)


def tensor_bytes(gb: float, dtype: str = "float32", n_params: int = N_PARAMS) -> int:
    """G: the bytes of the model's tensors (the weights; the GroupNorms add 256 bytes each)."""
    itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    d = dims_for(gb, n_params, itemsize)
    return n_params * d * d * itemsize + BLOCKS * 2 * CHANNELS * itemsize


def _export(args: argparse.Namespace) -> None:
    import torch

    model, inputs = build(args.gb, args.dtype)
    if args.reference:
        import numpy as np

        with torch.no_grad():
            y = model(*inputs)
        as_np = (lambda t: t.float().numpy()) if args.dtype == "bfloat16" else (lambda t: t.numpy())
        np.save(os.path.join(args.reference, "x.npy"), as_np(inputs[0]))
        np.save(os.path.join(args.reference, "y.npy"), as_np(y))
    start = time.perf_counter()
    if args.variant == "torch":
        torch.onnx.export(model, inputs, args.out, dynamo=bool(args.dynamo))
    else:
        import opbridge.onnx

        opbridge.onnx.export(model, inputs, args.out, dynamo=bool(args.dynamo), fuse=bool(args.fuse))
    print(json.dumps({"export_s": time.perf_counter() - start}))


@dataclasses.dataclass
class Measured:
    returncode: int
    peak_bytes: int  # ru_maxrss of the child (wait4)
    wall_s: float  # of the whole child, start-up included
    stdout: str
    stderr: str

    def json(self) -> dict:
        """The last line of stdout as JSON (what the export child prints)."""
        return json.loads(self.stdout.strip().splitlines()[-1])


def run_measured(argv: list[str], env: dict | None = None, timeout: float | None = None) -> Measured:
    """Runs ``argv`` as a child process; its exit status, peak RSS and wall time.

    The peak is the child's ru_maxrss from wait4, taken by a small launcher process (this file's
    ``spawn`` command) rather than by the caller: Linux counts the memory of the process that
    exec'd a program into that program's ru_maxrss (with vfork, the parent's own peak), so a
    large caller (a test process that has run ONNX Runtime) would inflate it."""
    with tempfile.TemporaryDirectory() as scratch:
        report = os.path.join(scratch, "rusage.json")
        out_path, err_path = os.path.join(scratch, "out"), os.path.join(scratch, "err")
        launcher = [sys.executable, os.path.abspath(__file__), "spawn", report, "--", *argv]
        start = time.perf_counter()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(launcher, stdout=out, stderr=err, env=env, start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        wall = time.perf_counter() - start
        with open(out_path, "rb") as f:
            stdout = f.read().decode(errors="replace")
        with open(err_path, "rb") as f:
            stderr = f.read().decode(errors="replace")
        if not os.path.exists(report):
            return Measured(returncode=proc.returncode or -9, peak_bytes=0, wall_s=wall, stdout=stdout,
                            stderr=stderr + f"\n(no report from the launcher; exit status {proc.returncode})")
        with open(report) as f:
            usage = json.load(f)
        return Measured(returncode=usage["returncode"], peak_bytes=usage["maxrss_kib"] * 1024, wall_s=wall,
                        stdout=stdout, stderr=stderr)


def _spawn(report: str, argv: list[str]) -> int:
    """Runs argv and writes its exit status and ru_maxrss (KiB, Linux) to ``report``."""
    proc = subprocess.Popen(argv)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here
    with open(report, "w") as f:
        json.dump({"returncode": proc.returncode, "maxrss_kib": usage.ru_maxrss}, f)
    return 0


def export_argv(gb: float, variant: str, dynamo: bool, out: str, *, fuse: bool = True, dtype: str = "float32",
                reference: str | None = None) -> list[str]:
    argv = [sys.executable, os.path.abspath(__file__), "export", "--gb", str(gb), "--variant", variant,
            "--dynamo", str(int(dynamo)), "--fuse", str(int(fuse)), "--dtype", dtype, "--out", out]
    return argv + (["--reference", reference] if reference else [])


def optimize_argv(src: str, dst: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "opbridge", "optimize", src, dst, *extra]


def child_env() -> dict:
    """The environment of a measured child: as this process's, with malloc returning large blocks
    to the system as soon as they are freed (glibc's default; a parent's MALLOC_* settings for
    timing benchmarks would keep freed memory in the child's RSS)."""
    env = dict(os.environ)
    for key in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        env.pop(key, None)
    return env


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["spawn"]:
        return _spawn(argv[1], argv[3:])  # spawn REPORT -- COMMAND...
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--gb", type=float, required=True)
    e.add_argument("--variant", choices=["torch", "opbridge"], required=True)
    e.add_argument("--dynamo", type=int, default=1)
    e.add_argument("--fuse", type=int, default=1)
    e.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    e.add_argument("--out", required=True)
    e.add_argument("--reference", default=None)
    args = p.parse_args(argv)
    _export(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
