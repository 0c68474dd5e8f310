"""Our ops inside an AOTInductor package (.pt2) against the same module in eager mode, on the CPU.
One module per op at the smallest shapes of the op's own benchmarks (where a per-call cost shows
most); both run from Python. A package's call has two costs eager has not: the callable that
torch._inductor.aoti_load_package returns flattens the inputs and unflattens the outputs with
pytree on every call, and the package calls a custom op through torch's generic by-name call (the
proxy executor). The first is measured by comparing the callable with the loader's own
`boxed_run` (a list of tensors in and out, as the C++ AOTIModelPackageLoader::run takes them).

track_pt2_time_over_eager: time(package callable) / time(eager), the median of rounds that
alternate the two (measure_speedup).
track_pt2_boxed_run_time_over_eager: the same with the loader's boxed_run instead of the callable;
above 1.05 the package's own call (the by-name call of our op included) costs more than 5%.

Without asv: `python -m benchmarks.benchmarks.bench_aoti` (from the repository root) prints the ratios,
five repeats each.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from ._common import THREADS, measure_speedup, torch_or_skip

CASES = ["group_norm-1x64x56x56", "inverse-4096x3x3", "inverse-1024x8x8", "ms_deform_attn-decoder"]
MSDA_LEVELS = ((64, 64), (32, 32), (16, 16), (8, 8))


def _module_and_inputs(case):
    """(module calling one op, its inputs) for `case`."""
    torch = torch_or_skip()
    import opbridge.ops

    rng = np.random.default_rng(0)
    op, shape = case.split("-", 1)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).float()  # noqa: E731
    if op == "group_norm":
        dims = tuple(int(d) for d in shape.split("x"))
        c = dims[1]

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(t(rng.standard_normal(c)))  # the same in every call
                self.b = torch.nn.Parameter(t(rng.standard_normal(c)))

            def forward(self, x):
                return opbridge.ops.group_norm(x, 32, self.w, self.b, 1e-5, "silu")

        return M().eval(), (t(rng.standard_normal(dims)),)
    if op == "inverse":
        dims = tuple(int(d) for d in shape.split("x"))
        n = dims[-1]

        class M(torch.nn.Module):
            def forward(self, a):
                return opbridge.ops.inverse(a)

        return M().eval(), (t(rng.standard_normal(dims) + np.sqrt(n) * np.eye(n)),)
    if op == "ms_deform_attn":
        n, m, d, p, lq = 2, 8, 32, 4, 300  # bench_ms_deform_attn's decoder shape
        shapes = np.array(MSDA_LEVELS, np.int64)
        s = int(shapes.prod(1).sum())

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("shapes", torch.from_numpy(shapes))
                self.register_buffer("starts", torch.from_numpy(np.concatenate([[0], np.cumsum(shapes.prod(1))[:-1]])))

            def forward(self, value, loc, attn):
                return opbridge.ops.ms_deform_attn(value, self.shapes, self.starts, loc, attn)

        level = len(MSDA_LEVELS)
        return M().eval(), (t(rng.standard_normal((n, s, m, d))), t(rng.uniform(0, 1, (n, lq, m, level, p, 2))),
                            t(rng.uniform(0, 1, (n, lq, m, level, p)) / (level * p)))
    raise ValueError(f"unknown case {case!r}")


def compile_package(case, folder):
    """Compiles `case`'s module (static shapes) into folder/<case>.pt2; returns the path."""
    torch = torch_or_skip()
    module, inputs = _module_and_inputs(case)
    ep = torch.export.export(module, inputs)
    path = os.path.join(folder, f"{case}.pt2")
    torch._inductor.aoti_compile_and_package(ep, package_path=path)
    return path


def ratio(case, path, boxed_run=False):
    """time(package) / time(eager) for `case`, measured side by side; the package called through
    torch's callable, or (boxed_run) through its loader's boxed_run."""
    torch = torch_or_skip()
    torch.set_num_threads(THREADS)
    module, inputs = _module_and_inputs(case)
    package = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        eager = lambda: module(*inputs)  # noqa: E731
        if boxed_run:
            # boxed_run takes the list's tensors over (it empties the list): a new list per call.
            pt2 = lambda: package.loader.boxed_run(list(inputs))[0]  # noqa: E731
        else:
            pt2 = lambda: package(*inputs)  # noqa: E731
        np.testing.assert_allclose(pt2().numpy(), eager().numpy(), rtol=0, atol=1e-5)
        return measure_speedup(eager, pt2)


class AotiPackageVsEager:
    """time(our op inside a .pt2) / time(the same module, eager)."""

    params = (CASES,)
    param_names = ["case"]
    timeout = 900

    def setup_cache(self):
        torch_or_skip()
        folder = tempfile.mkdtemp(prefix="opbridge-aoti-bench-")
        return {case: compile_package(case, folder) for case in CASES}

    def setup(self, paths, case):
        self.path = paths[case]

    def track_pt2_time_over_eager(self, paths, case):
        return ratio(case, self.path)

    track_pt2_time_over_eager.unit = "ratio"

    def track_pt2_boxed_run_time_over_eager(self, paths, case):
        return ratio(case, self.path, boxed_run=True)

    track_pt2_boxed_run_time_over_eager.unit = "ratio"


if __name__ == "__main__":
    folder = tempfile.mkdtemp(prefix="opbridge-aoti-bench-")
    for case in CASES:
        path = compile_package(case, folder)
        figures = {False: [], True: []}
        for _ in range(5):  # the two ways of calling alternate, so that load changes hit both alike
            for boxed_run in (False, True):
                figures[boxed_run].append(ratio(case, path, boxed_run))
        for boxed_run, how in ((False, "callable"), (True, "boxed_run")):
            f = figures[boxed_run]
            print(f"{case:28s} package ({how:9s}) / eager: median {np.median(f):.3f} (five repeats: "
                  f"{', '.join(f'{x:.3f}' for x in f)})")
