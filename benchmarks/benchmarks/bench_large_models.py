"""Real-size models: peak memory and time of ``opbridge.onnx.export`` and ``opbridge optimize``
against plain ``torch.onnx.export``, at 0.5, 2 and 4 GB of float32 tensors (the model of
``_large_model.py``: 64 torch.randn weights and two GroupNorm + SiLU blocks).

Every figure comes from its own child process: peak RSS is its ru_maxrss, time the wall time of
the export call (of the whole ``opbridge optimize`` command for optimize). All runs happen once,
in ``setup_cache`` (about 15 minutes and up to 12 GB of temporary disk at 4 GB; ``asv run -b
LargeModels``); the track_ methods report them. Goals (issue "Real-size models"), G = the model's tensor bytes:

* export, either exporter, with or without fusion: peak <= plain's peak + G + 0.5 GB, time <=
  2 x plain's + 10 s (``track_memory_margin_gb`` and ``track_time_margin_s`` >= 0 meet them);
* optimize, with its ONNX Runtime check: peak <= 2 G + 1.5 GB (``track_memory_margin_gb`` >= 0),
  t(4 GB) <= 2.3 x t(2 GB) (``track_time_4gb_over_2gb``).

``LargeModelKinds``: the same goals for one model per way a forward uses a large tensor (used
whole by a Conv or a Linear, sliced 1-D and N-D, gathered, viewed, tied, a buffer, a constant torch
folds: ``_large_model.KINDS``, 1 GB each, the 1-D slice at 2.24 GB), the model mixing them all
(0.45 GB), and diffusers' UNet2DConditionModel at Stable Diffusion 1.5's size (3.44 GB), dynamo
exporter; optimize reads plain torch's export.

``python -m benchmarks.bench_large_models [GB ...]`` (from ``benchmarks/``) prints the same
measurements as a table, without asv; ``python -m benchmarks.bench_large_models kinds [MODEL ...]``
the kinds' table.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from . import _large_model as L

SIZES = [0.5, 2.0, 4.0]
EXPORTERS = ["dynamo", "torchscript"]
PLAIN = "torch.onnx.export"
VARIANTS = [PLAIN, "opbridge.onnx.export", "opbridge.onnx.export(fuse=False)"]
INPUTS = ["dynamo export", "torchscript export"]  # what optimize reads: torch's export of the model
GB = 1e9


def _torch_or_skip() -> None:
    try:
        import torch  # noqa: F401  (the children need it)
    except ImportError as e:
        raise NotImplementedError("torch is not installed") from e


def _export(gb: float, exporter: str, variant: str, out: str) -> dict:
    dynamo = exporter == "dynamo"
    argv = L.export_argv(gb, "torch" if variant == PLAIN else "opbridge", dynamo, out,
                         fuse=not variant.endswith("(fuse=False)"))
    r = L.run_measured(argv, env=L.child_env())
    if r.returncode != 0:
        return {"error": f"exit status {r.returncode}: {r.stderr[-2000:]}"}
    return {"peak": r.peak_bytes, "time": r.json()["export_s"]}


def measure(sizes=SIZES, out=None) -> dict:
    """{("export", gb, exporter, variant) | ("optimize", gb, input): {"peak": bytes, "time": s} or
    {"error": text}}, every run in its own child process, one at a time."""
    results: dict = {}
    for gb in sizes:
        scratch = tempfile.mkdtemp(prefix="opbridge-bench-large-")
        try:
            inputs = {}
            for exporter in EXPORTERS:
                for variant in VARIANTS:
                    folder = os.path.join(scratch, f"{exporter}-{VARIANTS.index(variant)}")
                    os.makedirs(folder)
                    path = os.path.join(folder, "m.onnx")
                    results[("export", gb, exporter, variant)] = r = _export(gb, exporter, variant, path)
                    if out is not None:
                        print(f"  {gb:g} GB {exporter} {variant}: {r}", file=out, flush=True)
                    if variant == PLAIN and "error" not in r:
                        inputs[f"{exporter} export"] = path
                    else:
                        shutil.rmtree(folder)
            for name in INPUTS:
                if name not in inputs:
                    results[("optimize", gb, name)] = {"error": f"no {name}"}
                    continue
                dst = os.path.join(scratch, "optimized", "o.onnx")
                r = L.run_measured(L.optimize_argv(inputs[name], dst), env=L.child_env())
                results[("optimize", gb, name)] = (
                    {"peak": r.peak_bytes, "time": r.wall_s} if r.returncode == 0
                    else {"error": f"exit status {r.returncode}: {r.stderr[-2000:]}"})
                if out is not None:
                    print(f"  {gb:g} GB optimize {name}: {results[('optimize', gb, name)]}", file=out, flush=True)
                shutil.rmtree(os.path.dirname(dst), ignore_errors=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return results


def _get(results: dict, key: tuple, field: str) -> float:
    r = results[key]
    if "error" in r:
        raise NotImplementedError(r["error"])
    return r[field]


EXPORT_TASKS = [f"export {exporter}: {variant}" for exporter in EXPORTERS for variant in VARIANTS]
OPTIMIZE_TASKS = [f"optimize: {name}" for name in INPUTS]


def _key(gb: float, task: str) -> tuple:
    kind, _, rest = task.partition(": ")
    if kind == "optimize":
        return ("optimize", gb, rest)
    return ("export", gb, kind.split()[1], rest)


class LargeModels:
    """Each task (an export variant, or optimize of torch's export) at each size, in a child
    process: peak RSS (GB), time (s), and the margins to the goals (>= 0 meets them)."""

    params = (SIZES, EXPORT_TASKS + OPTIMIZE_TASKS)
    param_names = ["gb", "task"]
    timeout = 3600

    def setup_cache(self):
        _torch_or_skip()
        return measure()

    def track_peak_gb(self, results, gb, task):
        return _get(results, _key(gb, task), "peak") / GB

    track_peak_gb.unit = "GB"

    def track_time_s(self, results, gb, task):
        """Export: the export call; optimize: the whole command."""
        return _get(results, _key(gb, task), "time")

    track_time_s.unit = "s"

    def track_memory_margin_gb(self, results, gb, task):
        """Export: (plain's peak + G + 0.5 GB) - peak; optimize: (2 G + 1.5 GB) - peak."""
        key, g = _key(gb, task), L.tensor_bytes(gb)
        peak = _get(results, key, "peak")
        if key[0] == "optimize":
            return (2 * g + 1.5 * GB - peak) / GB
        if key[3] == PLAIN:
            raise NotImplementedError("the baseline itself")
        return (_get(results, key[:3] + (PLAIN,), "peak") + g + 0.5 * GB - peak) / GB

    track_memory_margin_gb.unit = "GB"

    def track_time_margin_s(self, results, gb, task):
        """Export: (2 x plain's time + 10 s) - time."""
        key = _key(gb, task)
        if key[0] == "optimize" or key[3] == PLAIN:
            raise NotImplementedError("export variants only")
        return 2 * _get(results, key[:3] + (PLAIN,), "time") + 10 - _get(results, key, "time")

    track_time_margin_s.unit = "s"

    def track_time_4gb_over_2gb(self, results, gb, task):
        """Optimize: t(4 GB) / t(2 GB), reported at gb=4; <= 2.3 meets the goal."""
        key = _key(gb, task)
        if key[0] != "optimize" or gb != 4.0:
            raise NotImplementedError("optimize, reported at 4 GB")
        return _get(results, key, "time") / _get(results, _key(2.0, task), "time")

    track_time_4gb_over_2gb.unit = "x"


def _table(results: dict, sizes) -> str:
    lines = ["| G | exporter | variant | peak RSS | export time | memory margin | time margin |",
             "|---|---|---|---|---|---|---|"]
    for gb in sizes:
        g = L.tensor_bytes(gb)
        for exporter in EXPORTERS:
            plain = results[("export", gb, exporter, PLAIN)]
            for variant in VARIANTS:
                r = results[("export", gb, exporter, variant)]
                if "error" in r:
                    lines.append(f"| {g / GB:.2f} GB | {exporter} | {variant} | {r['error'][:80]} | | | |")
                    continue
                margin = time_margin = ""
                if variant != PLAIN and "error" not in plain:
                    margin = f"{(plain['peak'] + g + 0.5 * GB - r['peak']) / GB:+.2f} GB"
                    time_margin = f"{2 * plain['time'] + 10 - r['time']:+.0f} s"
                lines.append(f"| {g / GB:.2f} GB | {exporter} | {variant} | {r['peak'] / GB:.2f} GB | "
                             f"{r['time']:.0f} s | {margin} | {time_margin} |")
    lines += ["", "| G | optimize input | peak RSS | time | memory margin (2 G + 1.5 GB) |", "|---|---|---|---|---|"]
    for gb in sizes:
        g = L.tensor_bytes(gb)
        for name in INPUTS:
            r = results[("optimize", gb, name)]
            if "error" in r:
                lines.append(f"| {g / GB:.2f} GB | {name} | {r['error'][:80]} | | |")
            else:
                lines.append(f"| {g / GB:.2f} GB | {name} | {r['peak'] / GB:.2f} GB | {r['time']:.0f} s | "
                             f"{(2 * g + 1.5 * GB - r['peak']) / GB:+.2f} GB |")
    return "\n".join(lines)


KIND_SIZES = {**{kind: 2.24 if kind == "sliced_1d" else 1.0 for kind in L.KINDS}, "mixed": 0.45, "unet_sd15": 0.0}


def measure_kind(model: str, out=None) -> dict:
    """{"plain" | "opbridge" | "optimize": {"peak": bytes, "time": s} or {"error": text}, "g": bytes}:
    dynamo export of one of KIND_SIZES by torch and by opbridge, and optimize of torch's export,
    each in its own child process, one at a time."""
    gb = KIND_SIZES[model]
    results: dict = {}
    scratch = tempfile.mkdtemp(prefix="opbridge-bench-kinds-")
    try:
        for variant in ("torch", "opbridge"):
            path = os.path.join(scratch, variant, "m.onnx")
            os.makedirs(os.path.dirname(path))
            r = L.run_measured(L.export_argv(gb, variant, True, path, model=model), env=L.child_env())
            if r.returncode != 0:
                results["plain" if variant == "torch" else variant] = {"error": f"exit status {r.returncode}: "
                                                                                f"{r.stderr[-2000:]}"}
                continue
            j = r.json()
            results["plain" if variant == "torch" else variant] = {"peak": r.peak_bytes, "time": j["export_s"]}
            results["g"] = j["state_bytes"]
            if variant == "opbridge":
                shutil.rmtree(os.path.dirname(path))
        if "error" not in results["plain"]:
            dst = os.path.join(scratch, "optimized", "o.onnx")
            r = L.run_measured(L.optimize_argv(os.path.join(scratch, "torch", "m.onnx"), dst), env=L.child_env())
            results["optimize"] = ({"peak": r.peak_bytes, "time": r.wall_s} if r.returncode == 0
                                   else {"error": f"exit status {r.returncode}: {r.stderr[-2000:]}"})
        else:
            results["optimize"] = {"error": "no plain export"}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if out is not None:
        print(f"  {model}: {results}", file=out, flush=True)
    return results


class LargeModelKinds:
    """Each model of KIND_SIZES: peak RSS and time of plain and opbridge dynamo export and of
    optimize, and the margins to the goals (>= 0 meets them)."""

    params = (list(KIND_SIZES), ["torch.onnx.export", "opbridge.onnx.export", "opbridge optimize"])
    param_names = ["model", "task"]
    timeout = 3600

    def setup_cache(self):
        _torch_or_skip()
        return {model: measure_kind(model) for model in KIND_SIZES}

    @staticmethod
    def _get(results, model, task, field):
        key = {"torch.onnx.export": "plain", "opbridge.onnx.export": "opbridge", "opbridge optimize": "optimize"}[task]
        r = results[model][key]
        if "error" in r:
            raise NotImplementedError(r["error"])
        return r[field]

    def track_peak_gb(self, results, model, task):
        return self._get(results, model, task, "peak") / GB

    track_peak_gb.unit = "GB"

    def track_time_s(self, results, model, task):
        """Export: the export call; optimize: the whole command."""
        return self._get(results, model, task, "time")

    track_time_s.unit = "s"

    def track_memory_margin_gb(self, results, model, task):
        """opbridge export: (plain's peak + G + 0.5 GB) - peak; optimize: (2 G + 1.5 GB) - peak."""
        g = results[model].get("g", 0)
        peak = self._get(results, model, task, "peak")
        if task == "opbridge optimize":
            return (2 * g + 1.5 * GB - peak) / GB
        if task == "torch.onnx.export":
            raise NotImplementedError("the baseline itself")
        return (self._get(results, model, "torch.onnx.export", "peak") + g + 0.5 * GB - peak) / GB

    track_memory_margin_gb.unit = "GB"

    def track_time_margin_s(self, results, model, task):
        """opbridge export: (2 x plain's time + 10 s) - time."""
        if task != "opbridge.onnx.export":
            raise NotImplementedError("opbridge's export only")
        return 2 * self._get(results, model, "torch.onnx.export", "time") + 10 - self._get(results, model, task, "time")

    track_time_margin_s.unit = "s"


def _kinds_table(results: dict) -> str:
    lines = ["| model | G | plain export | opbridge export | memory margin | time margin | optimize | memory margin |",
             "|---|---|---|---|---|---|---|---|"]

    def cell(r):
        return r["error"][:60] if "error" in r else f"{r['peak'] / GB:.2f} GB, {r['time']:.1f} s"

    for model, r in results.items():
        g = r.get("g", 0)
        plain, ours, opt = r["plain"], r["opbridge"], r["optimize"]
        margin = time_margin = opt_margin = ""
        if "error" not in plain and "error" not in ours:
            margin = f"{(plain['peak'] + g + 0.5 * GB - ours['peak']) / GB:+.2f} GB"
            time_margin = f"{2 * plain['time'] + 10 - ours['time']:+.1f} s"
        if "error" not in opt:
            opt_margin = f"{(2 * g + 1.5 * GB - opt['peak']) / GB:+.2f} GB"
        lines.append(f"| {model} | {g / GB:.2f} GB | {cell(plain)} | {cell(ours)} | {margin} | {time_margin} | "
                     f"{cell(opt)} | {opt_margin} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["kinds"]:
        chosen = sys.argv[2:] or list(KIND_SIZES)
        print(_kinds_table({model: measure_kind(model, out=sys.stderr) for model in chosen}))
    else:
        chosen = [float(a) for a in sys.argv[1:]] or SIZES
        print(_table(measure(chosen, out=sys.stderr), chosen))
