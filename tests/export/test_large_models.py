"""Models with large tensors through both exporters and `opbridge optimize`, each step in a child
process whose exit status and peak RSS (ru_maxrss, from wait4) are asserted against a budget
computed here from plain torch.onnx.export of the same model in a child process (G = the model's
parameters, buffers and constants, in bytes):

* opbridge.onnx.export (after opbridge.nn.convert; fusion on): peak <= plain's peak (same exporter)
  + G + 0.5 GB, and the export call's time <= 2 x plain's + 10 s;
* opbridge optimize of plain's dynamo export (rewrite + ONNX Runtime check): peak <= 2 G + 1.5 GB,
  run with that budget as --max-memory;

and every model written runs in ONNX Runtime and gives torch's output. The models
(benchmarks/benchmarks/_large_model.py): one per way a forward uses a large tensor (KINDS: used
whole by a Conv or a Linear, a 1-D or N-D parameter sliced, gathered, viewed, tied between layers,
a buffer, a constant torch lifts and folds), at 1 GB (the 1-D slice at 2.24 GB); diffusers'
UNet2DConditionModel at Stable Diffusion 1.5's size (3.44 GB); the 64-matmul model at 2.2 GB,
both exporters; transformers' Deformable DETR at 1.1 GB (optimize rewrites its deformable
attention). Those run with --run-slow. In the default suite: the model that mixes every kind,
at 0.45 GB, both exporters; and the same model through opbridge's steps instrumented
(tests/helpers/large_model_probe.py): no step of ours reads a large tensor except to write it, once, and
none grows the process by more than a small bound. All need the machine to themselves (the
`serial` marker: skipped under pytest-xdist and AddressSanitizer).

The same small model in float16 and bfloat16: its tensors reach the data file bit for bit, fused,
and (float16; ONNX Runtime has no bfloat16 MatMul on the CPU) run as torch computes them. Export
and optimize refuse, before they start, a model the memory available cannot hold.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest

import opbridge
import opbridge.cli
import opbridge.onnx
from helpers.cmake_helpers import REPO

pytestmark = [pytest.mark.torch]

GB = 1e9
SIZE_GB = 2.23  # the matmuls model: 64 x 2944^2 float32 = 2.219 GB
EXPORT_SLACK = 0.5 * GB
OPTIMIZE_SLACK = 1.5 * GB
# A step of ours may grow the process by this much (its own bookkeeping: the graph, onnx's shape
# inference on a graph without tensors); each large tensor of the probe's model is 50 MB, so a
# copy of any of them, or onnx's data propagation over a 1-D one (70 bytes per element), fails it.
STEP_GROWTH_BOUND = 32 << 20
PROBE = REPO / "tests" / "helpers" / "large_model_probe.py"


def _large_model():
    spec = importlib.util.spec_from_file_location(
        "_large_model", REPO / "benchmarks" / "benchmarks" / "_large_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


L = _large_model()
G = L.tensor_bytes(SIZE_GB)
KIND_GB = {kind: 2.24 if kind == "sliced_1d" else 1.0 for kind in L.KINDS}


def _run(argv, what, env=None):
    result = L.run_measured(argv, env=env or L.child_env(), timeout=1800)
    assert result.returncode == 0, f"{what}: exit status {result.returncode}\n{result.stdout[-3000:]}\n" \
                                   f"{result.stderr[-3000:]}"
    return result


def _ort_output(path, x):
    sess = opbridge.InferenceSession(path)
    try:
        return sess.run(None, {sess.get_inputs()[0].name: x})[0]
    finally:
        del sess
        gc.collect()  # ORT's session objects form cycles; the weights go now


_ORT_CHILD = """
import json, sys
import numpy as np
import onnxruntime as ort
import opbridge
path, ref, lean = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
so = ort.SessionOptions()
kwargs = {}
if lean:  # the check's settings (opbridge/_optimize.py): no copies of Conv weights, no folding
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    kwargs["disabled_optimizers"] = ["ConstantFolding"]
sess = opbridge.InferenceSession(path, so, **kwargs)
inputs = np.load(ref + "/inputs.npz")
feeds = {i.name: inputs[f"arr_{k}"] for k, i in enumerate(sess.get_inputs())}
y, want = sess.run(None, feeds)[0], np.load(ref + "/y.npy")
print(json.dumps({"err": float(np.abs(y - want).max()), "scale": float(np.abs(want).max())}))
"""


def _ort_matches(path, ref, *, lean=True, rtol=1e-4):
    """Runs the model at ``path`` in ONNX Runtime (a child process: its memory is not this test's)
    on the inputs torch's output was computed for, and compares."""
    r = subprocess.run([sys.executable, "-c", _ORT_CHILD, str(path), str(ref), str(int(lean))],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["scale"] > 0.01, "a vanished output compares nothing"
    assert out["err"] <= rtol * max(1.0, out["scale"]), (path, out)


def _fused_group_norms(path):
    model = onnx.load(path, load_external_data=False)
    silu = [n for n in model.graph.node if n.domain == opbridge.DOMAIN and n.op_type == "GroupNorm"
            and any(a.name == "activation" and a.s == b"silu" for a in n.attribute)]
    leftovers = [n.op_type for n in model.graph.node if n.op_type in ("InstanceNormalization", "Sigmoid")]
    return len(silu), leftovers


def _group_norms(path):
    model = onnx.load(path, load_external_data=False)
    ours = sum(n.domain == opbridge.DOMAIN and n.op_type == "GroupNorm" for n in model.graph.node)
    left = sum(n.op_type in ("InstanceNormalization", "GroupNormalization") for n in model.graph.node)
    return ours, left


def _external_layout(path, g=None):
    folder, name = os.path.dirname(path), os.path.basename(path)
    assert os.path.getsize(path) < 1 << 20, "the model file should hold the graph only"
    assert os.path.getsize(os.path.join(folder, name + ".data")) >= (G if g is None else g) * 0.99


def _bounded(tmp_path, model, gb, exporters=("dynamo",), *, min_group_norms=2, rtol=1e-4):
    """Plain export, ours and optimize of plain's dynamo export of ``model`` (_large_model.MODELS),
    each in a child process, against the budgets of the module docstring; each written model runs
    in ONNX Runtime and gives torch's output. Returns the report lines (also printed)."""
    ref = tmp_path / "ref"
    ref.mkdir()
    report = []
    plain_dynamo = None
    for exporter in exporters:
        dynamo = exporter == "dynamo"
        plain_dir = tmp_path / f"plain_{exporter}"
        plain_dir.mkdir()
        plain_path = str(plain_dir / "m.onnx")
        first = not any(ref.iterdir())
        plain = _run(L.export_argv(gb, "torch", dynamo, plain_path, model=model, reference=str(ref) if first else None),
                     f"torch {exporter}")
        ours_dir = tmp_path / f"ours_{exporter}"
        ours_dir.mkdir()
        ours_path = str(ours_dir / "m.onnx")
        ours = _run(L.export_argv(gb, "opbridge", dynamo, ours_path, model=model), f"opbridge {exporter}")
        g = ours.json()["state_bytes"]
        t_plain, t_ours = plain.json()["export_s"], ours.json()["export_s"]
        budget, time_budget = plain.peak_bytes + g + EXPORT_SLACK, 2 * t_plain + 10
        report.append(f"{model} {exporter} export, G {g / GB:.2f} GB: plain {plain.peak_bytes / GB:.2f} GB "
                      f"{t_plain:.1f} s, opbridge {ours.peak_bytes / GB:.2f} GB {t_ours:.1f} s "
                      f"(budget {budget / GB:.2f} GB, {time_budget:.1f} s)")
        assert ours.peak_bytes <= budget, report[-1]
        assert t_ours <= time_budget, report[-1]
        ours_gn, left = _group_norms(ours_path)
        assert ours_gn >= min_group_norms and left == 0, (ours_gn, left)
        _ort_matches(ours_path, ref, rtol=rtol)
        shutil.rmtree(ours_dir)
        if dynamo:
            plain_dynamo = plain_path
        else:
            shutil.rmtree(plain_dir)
    if plain_dynamo is not None:
        budget = int(2 * g + OPTIMIZE_SLACK)
        out_path = str(tmp_path / "opt" / "m.onnx")
        opt = _run(L.optimize_argv(plain_dynamo, out_path, "--max-memory", str(budget)), "opbridge optimize")
        report.append(f"{model} optimize: {opt.peak_bytes / GB:.2f} GB {opt.wall_s:.1f} s (budget {budget / GB:.2f} GB)")
        assert opt.peak_bytes <= budget, report[-1]
        _ort_matches(out_path, ref, rtol=rtol)
        shutil.rmtree(os.path.dirname(plain_dynamo))
        shutil.rmtree(tmp_path / "opt")
    print("\n".join(report))
    return report


@pytest.mark.serial
def test_model_mixing_every_kind_of_large_tensor_in_bounded_memory(tmp_path):
    """Every kind at once, small (0.45 GB: past AUTO_EXTERNAL_BYTES, so both exporters write
    external data), both exporters and optimize."""
    _bounded(tmp_path, "mixed", 0.45, ("dynamo", "torchscript"), min_group_norms=3)


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("kind", L.KINDS)
def test_kind_of_large_tensor_in_bounded_memory(tmp_path, kind):
    _bounded(tmp_path, kind, KIND_GB[kind], min_group_norms=3 if kind == "conv" else 2)


@pytest.mark.slow
@pytest.mark.serial
def test_sliced_1d_parameter_model_runs_in_onnx_runtime_as_users_run_it(tmp_path):
    """The 2.24 GB model with a 1-D parameter sliced by its forward: exported by opbridge, it runs
    in an ONNX Runtime session with default options (which fold the slice)."""
    ref = tmp_path / "ref"
    ref.mkdir()
    path = str(tmp_path / "m.onnx")
    _run(L.export_argv(2.24, "opbridge", True, path, model="sliced_1d", reference=str(ref)), "opbridge export")
    _ort_matches(path, ref, lean=False)


@pytest.mark.slow
@pytest.mark.serial
def test_stable_diffusion_unet_at_real_size_in_bounded_memory(tmp_path):
    """diffusers' UNet2DConditionModel at Stable Diffusion 1.5's configuration, random init
    (3.44 GB of float32): dynamo export and optimize (its 61 GroupNorms)."""
    pytest.importorskip("diffusers")
    _bounded(tmp_path, "unet_sd15", 0, min_group_norms=61, rtol=1e-3)


DETR_GB = 1.1


@pytest.mark.slow
@pytest.mark.serial
def test_deformable_detr_at_real_size_optimizes_in_bounded_memory(tmp_path):
    """A plain dynamo export (external data) of transformers' Deformable DETR with 1.1 GB of
    weights (_large_model.build_deformable_detr: 4 deformable-attention modules): optimize rewrites
    every attention chain within 2 G + 1.5 GB, leaves no GridSample, and gives torch's output."""
    pytest.importorskip("transformers")
    from opbridge.onnx._msda_rules import LABEL

    ref = tmp_path / "ref"
    ref.mkdir()
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    plain_path = str(plain_dir / "m.onnx")
    plain = _run(L.export_argv(DETR_GB, "torch", True, plain_path, model="deformable_detr", reference=str(ref)),
                 "torch dynamo")
    g = plain.json()["state_bytes"]
    assert g >= 1.0 * GB
    assert sorted(os.listdir(plain_dir)) == ["m.onnx", "m.onnx.data"]
    budget = int(2 * g + OPTIMIZE_SLACK)
    out_path = str(tmp_path / "opt" / "m.onnx")
    opt = _run(L.optimize_argv(plain_path, out_path, "--max-memory", str(budget), "--json"), "opbridge optimize")
    report = (f"Deformable DETR optimize, G {g / GB:.2f} GB: {opt.peak_bytes / GB:.2f} GB {opt.wall_s:.1f} s "
              f"(budget {budget / GB:.2f} GB); plain export {plain.peak_bytes / GB:.2f} GB {plain.wall_s:.1f} s")
    print(report)
    assert opt.peak_bytes <= budget, report
    doc = json.loads(opt.stdout)
    assert doc["ok"] and doc["rewritten"].get(LABEL) == 4, doc
    shutil.rmtree(plain_dir)
    nodes = onnx.load(out_path, load_external_data=False).graph.node
    assert sum(n.op_type == "MultiScaleDeformableAttention" and n.domain == opbridge.DOMAIN for n in nodes) == 4
    assert not any(n.op_type == "GridSample" for n in nodes)
    _ort_matches(out_path, ref, rtol=1e-4)
    shutil.rmtree(tmp_path / "opt")


@pytest.mark.slow
@pytest.mark.serial
def test_real_size_model_exports_and_optimizes_in_bounded_memory(tmp_path):
    """The 64-matmul model at 2.2 GB, both exporters; optimize also below 1.5 G + 0.5 GB: the check
    never holds two copies of every weight (the original's and the rewritten model's ORT sessions
    one after the other)."""
    assert G >= 2.2 * GB and L.dims_for(SIZE_GB) ** 2 * 4 >= 32 * 2**20
    ref = tmp_path / "ref"
    ref.mkdir()
    report = []

    # Plain torch.onnx.export, dynamo: the baseline, and the input of optimize later. The child
    # also writes an example input and torch's output for it.
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    plain_path = str(plain_dir / "m.onnx")
    plain = {True: _run(L.export_argv(SIZE_GB, "torch", True, plain_path, reference=str(ref)), "torch dynamo")}
    x, y = np.load(ref / "x.npy"), np.load(ref / "y.npy")
    assert np.abs(y).max() > 0.1  # a real output, not a saturated or vanished one

    for dynamo in (True, False):
        label = "dynamo" if dynamo else "TorchScript"
        if not dynamo:
            scratch = tmp_path / "plain_ts"
            scratch.mkdir()
            plain[False] = _run(L.export_argv(SIZE_GB, "torch", False, str(scratch / "m.onnx")), "torch TorchScript")
            shutil.rmtree(scratch)
        ours_dir = tmp_path / f"ours_{label}"
        ours_dir.mkdir()
        ours_path = str(ours_dir / "m.onnx")
        ours = _run(L.export_argv(SIZE_GB, "opbridge", dynamo, ours_path), f"opbridge {label}")
        budget = plain[dynamo].peak_bytes + G + EXPORT_SLACK
        report.append(f"export {label}: plain {plain[dynamo].peak_bytes / GB:.2f} GB {plain[dynamo].wall_s:.0f} s, "
                      f"opbridge {ours.peak_bytes / GB:.2f} GB {ours.wall_s:.0f} s (budget {budget / GB:.2f} GB)")
        assert ours.peak_bytes <= budget, report[-1]
        assert sorted(os.listdir(ours_dir)) == ["m.onnx", "m.onnx.data"]
        _external_layout(ours_path)
        assert _fused_group_norms(ours_path) == (2, [])
        np.testing.assert_allclose(_ort_output(ours_path, x), y, rtol=1e-4, atol=1e-4)
        shutil.rmtree(ours_dir)

    # opbridge optimize on the plain dynamo export, with the memory budget as --max-memory.
    budget = int(2 * G + OPTIMIZE_SLACK)
    before = {n: os.stat(plain_dir / n).st_mtime_ns for n in os.listdir(plain_dir)}
    out_path = str(tmp_path / "opt" / "m.onnx")
    opt = _run(L.optimize_argv(plain_path, out_path, "--max-memory", str(budget)), "opbridge optimize")
    report.append(f"optimize: {opt.peak_bytes / GB:.2f} GB {opt.wall_s:.0f} s (budget {budget / GB:.2f} GB)")
    print("\n".join(report))
    assert opt.peak_bytes <= budget, report[-1]
    assert opt.peak_bytes <= 1.5 * G + 0.5 * GB, report[-1] + ": the weights were held twice"
    assert {n: os.stat(plain_dir / n).st_mtime_ns for n in os.listdir(plain_dir)} == before  # input untouched
    shutil.rmtree(plain_dir)
    assert sorted(os.listdir(tmp_path / "opt")) == ["m.onnx", "m.onnx.data"]  # no scratch left
    _external_layout(out_path)
    assert _fused_group_norms(out_path) == (2, [])
    np.testing.assert_allclose(_ort_output(out_path, x), y, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# No step of ours copies a large tensor: instrumented (tests/helpers/large_model_probe.py)
# ---------------------------------------------------------------------------------------------


def _probe(*argv):
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs /proc/self/clear_refs (Linux) to measure each step's peak")
    r = subprocess.run([sys.executable, str(PROBE), *argv], capture_output=True, text=True, timeout=900,
                       env=L.child_env())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _assert_bounded(result, writer, own_allowance=None):
    """Each large tensor read once, by ``writer`` writing it (tofile: straight from its memory or its
    file), and no step of ours grown by more than STEP_GROWTH_BOUND (``own_allowance``: steps whose
    growth is bounded otherwise, {name: bytes})."""
    reads = result["reads"]
    assert reads, "the model has large tensors: the writer reads each"
    bad = [r for r in reads if r[2] != "tofile" or r[3] != writer]
    assert not bad, f"large tensors read other than by the writer: {bad}"
    names = [r[0] for r in reads]
    assert len(names) == len(set(names)), f"a large tensor read twice: {names}"
    allowance = {"torch.onnx.export (torch's own)": None, **(own_allowance or {})}
    over = [(name, grew) for name, grew in result["stages"]
            if (allowance.get(name, STEP_GROWTH_BOUND) is not None and grew > allowance.get(name, STEP_GROWTH_BOUND))]
    assert not over, f"steps that grew the process past their bound: {over} (all: {result['stages']})"
    return names


@pytest.mark.serial
@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_no_step_of_export_copies_a_large_tensor(tmp_path, dynamo):
    result = _probe("export", str(tmp_path / "m.onnx"), "--gb", "0.45", "--dynamo", str(int(dynamo)))
    names = _assert_bounded(result, "external data written")
    # Every large tensor of the model written was read (to write it), and only those.
    written = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False).graph.initializer
    large = {t.name for t in written if t.data_location == onnx.TensorProto.EXTERNAL
             and int({e.key: e.value for e in t.external_data}["length"]) > result["bound"]}
    assert set(names) == large and len(large) >= 5, (names, large)
    stages = {name for name, _ in result["stages"]}
    assert {"shape inference", "rules and rewrites", "external data written", "fix-ups"} <= stages


@pytest.mark.serial
@pytest.mark.parametrize("model, gb", [("mixed", 0.45), ("sliced_1d", 0.3)])
def test_no_step_of_optimize_copies_a_large_tensor(tmp_path, model, gb):
    src = tmp_path / "in" / "m.onnx"
    src.parent.mkdir()
    _run(L.export_argv(gb, "torch", True, str(src), model=model), "torch export")
    g = sum(os.path.getsize(src.parent / n) for n in os.listdir(src.parent))
    # The check's ONNX Runtime sessions map the weights and read what the model's run reads (for
    # the mixed model: whole weights, at most G), one session at a time. The sliced 1-D parameter
    # is read 4 elements at a time: constant folding would load and fold it (2 G).
    check = g + (128 << 20) if model == "mixed" else 96 << 20
    result = _probe("optimize", str(src), str(tmp_path / "out" / "o.onnx"))
    _assert_bounded(result, "model written", {"ONNX Runtime check": check})


# ---------------------------------------------------------------------------------------------
# Refused before starting when the memory available cannot hold it
# ---------------------------------------------------------------------------------------------


def _no_torch_export(monkeypatch):
    import torch

    def refused(*args, **kwargs):
        raise AssertionError("torch.onnx.export ran")

    monkeypatch.setattr(torch.onnx, "export", refused)


@pytest.mark.parametrize("dynamo, external_data, option", [
    (False, True, "dynamo=True needs about"),
    (True, False, "external_data=True needs about"),
    (True, True, "No export option needs less"),
])
def test_export_refuses_a_model_the_memory_cannot_hold(tmp_path, monkeypatch, dynamo, external_data, option):
    from opbridge import _memory

    model, inputs = L.build_kind("mixed", 0.02)
    _no_torch_export(monkeypatch)
    monkeypatch.setenv(_memory.ENV, "100M")
    with pytest.raises(MemoryError) as e:
        opbridge.onnx.export(model, inputs, tmp_path / "m.onnx", dynamo=dynamo, external_data=external_data)
    text = str(e.value)
    assert "needs about" in text and "0.10 GB are available (set by OPBRIDGE_MEMORY_LIMIT)" in text, text
    assert option in text and "Nothing was exported" in text, text
    assert os.listdir(tmp_path) == []


def test_export_within_the_memory_available_is_not_refused(tmp_path, monkeypatch):
    from opbridge import _memory
    from opbridge.onnx import _external_data

    model, inputs = L.build_kind("mixed", 0.02)
    need = _external_data.export_need(_external_data.state_bytes(model), True, "external")
    monkeypatch.setenv(_memory.ENV, str(need))
    opbridge.onnx.export(model, inputs, tmp_path / "m.onnx", external_data=True)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    monkeypatch.setenv(_memory.ENV, "lots")
    with pytest.raises(ValueError, match="OPBRIDGE_MEMORY_LIMIT expects a size"):
        opbridge.onnx.export(model, inputs, tmp_path / "n.onnx")


def test_optimize_refuses_a_model_the_memory_cannot_hold(tmp_path, monkeypatch, capsys):
    from opbridge import _memory

    src = tmp_path / "in" / "m.onnx"
    src.parent.mkdir()
    model, inputs = L.build_kind("mixed", 0.02)
    opbridge.onnx.export(model, inputs, src, external_data=True)
    monkeypatch.setenv(_memory.ENV, "100M")
    code = opbridge.cli.main(["optimize", str(src), str(tmp_path / "out" / "o.onnx")])
    err = capsys.readouterr().err
    assert code == 2 and "needs about" in err and "OPBRIDGE_MEMORY_LIMIT" in err and "nothing was read" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_memory_available_is_the_cgroups_limit_where_it_is_lower(tmp_path, monkeypatch, version):
    from opbridge import _memory

    root = tmp_path / "cgroup"
    (tmp_path / "meminfo").write_text("MemTotal: 100000000 kB\nMemAvailable: 50000000 kB\n")
    if version == "v2":
        (tmp_path / "self").write_text("0::/job\n")
        folder = root / "job"
        folder.mkdir(parents=True)
        (folder / "memory.max").write_text("8000000000\n")
        (folder / "memory.current").write_text("3000000000\n")
        (folder / "memory.stat").write_text("anon 1\ninactive_file 1000000000\n")
    else:
        (tmp_path / "self").write_text("4:memory:/job\n1:cpu:/\n")
        folder = root / "memory"  # the cgroup's own folder mounted as the root, as in a container
        folder.mkdir(parents=True)
        (folder / "memory.limit_in_bytes").write_text("8000000000\n")
        (folder / "memory.usage_in_bytes").write_text("3000000000\n")
        (folder / "memory.stat").write_text("total_inactive_file 1000000000\n")
    monkeypatch.setattr(_memory, "PROC_CGROUP", str(tmp_path / "self"))
    monkeypatch.setattr(_memory, "PROC_MEMINFO", str(tmp_path / "meminfo"))
    monkeypatch.setattr(_memory, "CGROUP_ROOT", str(root))
    monkeypatch.delenv(_memory.ENV, raising=False)
    # 8 GB limit, 3 GB used of which 1 GB is page cache the kernel can drop: 6 GB left.
    assert _memory.available() == (6_000_000_000, "the cgroup's memory limit")
    (folder / ("memory.max" if version == "v2" else "memory.limit_in_bytes")).write_text(
        "max\n" if version == "v2" else f"{2**63 - 4096}\n")
    assert _memory.available() == (50_000_000 * 1024, "MemAvailable")


def _external_bytes(path, name):
    """The bytes of initializer ``name`` in the data file beside the model at ``path``."""
    proto = onnx.load(path, load_external_data=False)
    t = next(t for t in proto.graph.initializer if t.name == name)
    assert t.data_location == onnx.TensorProto.EXTERNAL, name
    info = {e.key: e.value for e in t.external_data}
    with open(os.path.join(os.path.dirname(path), info["location"]), "rb") as f:
        f.seek(int(info.get("offset", 0)))
        return f.read(int(info["length"]))


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_models_export_and_optimize(tmp_path, dtype, dynamo):
    torch = pytest.importorskip("torch")
    model, (x,) = L.build(0.004, dtype, n_params=8)
    path = str(tmp_path / "m.onnx")
    proto = opbridge.onnx.export(model, (x,), path, dynamo=dynamo, external_data=True)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    # What export returns refers to the data file, as the file written does.
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer
               if t.name.startswith("weights."))
    want = onnx.TensorProto.FLOAT16 if dtype == "float16" else onnx.TensorProto.BFLOAT16
    for i, w in enumerate(model.weights):
        name = f"weights.{i}"
        assert next(t.data_type for t in proto.graph.initializer if t.name == name) == want
        assert _external_bytes(path, name) == w.detach().view(torch.int16).numpy().tobytes(), name
    assert _fused_group_norms(path) == (2, [])
    if dtype == "bfloat16":
        return
    with torch.no_grad():
        y = model(x).float().numpy()
    got = _ort_output(path, x.numpy()).astype(np.float32)
    np.testing.assert_allclose(got, y, rtol=0, atol=2e-2 * max(1.0, np.abs(y).max()))

    # optimize on torch's own export of it: the check runs, the output keeps the data beside it.
    plain = str(tmp_path / "plain" / "p.onnx")
    os.makedirs(os.path.dirname(plain))
    torch.onnx.export(model, (x,), plain, dynamo=True, external_data=True)
    out = str(tmp_path / "opt" / "o.onnx")
    assert opbridge.cli.main(["optimize", plain, out]) == 0
    assert sorted(os.listdir(tmp_path / "opt")) == ["o.onnx", "o.onnx.data"]
    assert _fused_group_norms(out) == (2, [])
    got = _ort_output(out, x.numpy()).astype(np.float32)
    np.testing.assert_allclose(got, y, rtol=0, atol=2e-2 * max(1.0, np.abs(y).max()))


_EXPORT_FULL_DISK_CHILD = """
import resource, sys
sys.path.insert(0, sys.argv[1])
import _large_model as L
import opbridge.onnx
model, inputs = L.build(0.004, n_params=8)  # 4 MB of weights
# Files may not grow past 1 MiB: writing the data file fails midway with EFBIG, as a full disk
# fails with ENOSPC (Python ignores SIGXFSZ, so the write returns the error).
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
try:
    opbridge.onnx.export(model, inputs, sys.argv[2], dynamo=sys.argv[3] == "1", external_data=True)
except OSError as e:
    print(f"OSError: {e}")
    sys.exit(3)
"""


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_export_that_cannot_write_its_data_names_the_file_and_leaves_nothing(tmp_path, dynamo):
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([sys.executable, "-c", _EXPORT_FULL_DISK_CHILD, str(REPO / "benchmarks" / "benchmarks"),
                        str(out / "m.onnx"), str(int(dynamo))], capture_output=True, text=True)
    assert r.returncode == 3, r.stdout + r.stderr
    # dynamo: the data file fails; TorchScript: the exporter's own file, in a scratch folder beside f.
    assert f"cannot write {out / 'm.onnx'}" in r.stdout and "File too large" in r.stdout, r.stdout
    assert os.listdir(out) == []
