"""Figures and messages the docs quote, against what the code gives today: each test reads the
quoted text out of the doc page and compares it with the real thing, so the page and the code
cannot drift apart silently (docs/README.md, "Code blocks")."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from helpers.docs_blocks import REPO, blocks

README = REPO / "README.md"
DOC = REPO / "docs"


def _text(path) -> str:
    return " ".join(path.read_text().split())  # prose wraps anywhere: compare with spaces collapsed


def _output_blocks(path) -> list[str]:
    return [b.text for b in blocks(path) if b.kind == "output"]


# ---- examples/rms_norm: the count of hand-written lines ------------------------------------------

def test_hand_written_lines_of_rms_norm_example():
    """docs/cpp.md and README.md quote scripts/count_hand_lines.py's count for examples/rms_norm,
    in total and per part (declaration, kernels and compute functions, Python backward)."""
    import shutil

    if not (shutil.which("ruff") and shutil.which("clang-format")):
        pytest.skip("needs ruff and clang-format (requirements/test.txt): the count is of formatted code")
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "count_hand_lines.py"), str(REPO / "examples" / "rms_norm"),
                        "rms_norm", "--namespace", "myops"], capture_output=True, text=True, check=True)
    per_file = {k: int(v) for k, v in re.findall(r"^(\S+): (\d+)$", r.stdout, flags=re.M)}
    total = int(re.search(r"^total: (\d+) hand-written lines", r.stdout, flags=re.M).group(1))
    assert sum(per_file.values()) == total, r.stdout
    parts = {
        "declaration": per_file.get("ops/rms_norm/rms_norm_decl.cpp", 0),
        "kernels": per_file.get("ops/rms_norm/rms_norm.h", 0) + per_file.get("ops/rms_norm/rms_norm_cpu.cpp", 0),
        "python": per_file.get("python/myops/ops/rms_norm.py", 0),
    }
    assert sum(parts.values()) == total, r.stdout  # every counted file is in one of the parts
    cpp = _text(DOC / "cpp.md")
    m = re.search(r"\*\*(\d+) lines written by hand\*\* \(non-blank, non-comment, tests excluded: the declaration "
                  r"and its checks (\d+), the kernels and compute functions (\d+), the Python backward (\d+)\)", cpp)
    assert m, "docs/cpp.md no longer quotes the count in the form this test reads"
    quoted = dict(zip(["total", "declaration", "kernels", "python"], map(int, m.groups())))
    assert quoted == {"total": total, **parts}, f"docs/cpp.md quotes {quoted}, the script counts:\n{r.stdout}"
    m = re.search(r"`examples/rms_norm/` \((\d+) hand-written lines over the scaffold\)", _text(README))
    assert m and int(m.group(1)) == total, "README.md's count of examples/rms_norm's hand-written lines"


def test_hand_written_lines_of_shapes_examples():
    """docs/declarations.md lists scripts/count_hand_lines.py's count per op of examples/shapes;
    each is at most 60 lines beyond the scaffold."""
    import shutil

    if not (shutil.which("ruff") and shutil.which("clang-format")):
        pytest.skip("needs ruff and clang-format (requirements/test.txt): the count is of formatted code")
    ops = ["segment_sum", "window_stats", "select_rows", "bias_act"]
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "count_hand_lines.py"), str(REPO / "examples" / "shapes"),
                        *ops, "--namespace", "shapes"], capture_output=True, text=True, check=True)
    counted = {k: int(v) for k, v in re.findall(r"^op (\w+): (\d+)$", r.stdout, flags=re.M)}
    table = _text(DOC / "declarations.md")
    quoted = {op: int(n) for op, n in re.findall(r"\| `(\w+)\([^|]*\)` \|[^|]*\|[^|]*\| (\d+) \|", table)
              if op in ops}
    assert quoted == counted, f"docs/declarations.md lists {quoted}, the script counts:\n{r.stdout}"
    assert set(counted) == set(ops) and max(counted.values()) <= 60, r.stdout


def test_hand_written_lines_of_index_ops_examples():
    """docs/declarations.md lists scripts/count_hand_lines.py's count per op of examples/index_ops;
    each is at most 60 lines beyond the scaffold."""
    import shutil

    if not (shutil.which("ruff") and shutil.which("clang-format")):
        pytest.skip("needs ruff and clang-format (requirements/test.txt): the count is of formatted code")
    ops = ["segment_max", "radius_neighbors"]
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "count_hand_lines.py"),
                        str(REPO / "examples" / "index_ops"), *ops, "--namespace", "index_ops"],
                       capture_output=True, text=True, check=True)
    counted = {k: int(v) for k, v in re.findall(r"^op (\w+): (\d+)$", r.stdout, flags=re.M)}
    table = _text(DOC / "declarations.md")
    quoted = {op: int(n) for op, n in re.findall(r"\| `(\w+)\([^|]*\)` \|[^|]*\|[^|]*\| (\d+) \|", table)
              if op in ops}
    assert quoted == counted, f"docs/declarations.md lists {quoted}, the script counts:\n{r.stdout}"
    assert set(counted) == set(ops) and max(counted.values()) <= 60, r.stdout


# ---- messages ------------------------------------------------------------------------------------

def test_torch_version_error_message():
    """docs/install.md quotes the error for a torch older than 2.11, for torch 2.10.0+cpu."""
    from opbridge import _library

    quoted = [t for t in _output_blocks(DOC / "install.md") if "torch ops need" in t]
    assert len(quoted) == 1
    with pytest.raises(_library.TorchVersionError) as info:
        _library.check_torch_version("2.10.0+cpu")
    assert str(info.value) == " ".join(quoted[0].split())
    # The warning install.md quotes, as `import opbridge` gives it in a process that has imported
    # that torch (where there is a torch library to register).
    said = re.search(r'\("(opbridge: torch ops not registered\. )\.\.\."\)', _text(DOC / "install.md"))
    assert said, "docs/install.md no longer quotes the warning in the form this test reads"
    if importlib.util.find_spec("torch") is not None and _library.torch_library_path() is not None:
        code = ("import json, warnings, torch\n"
                "torch.__version__ = '2.10.0+cpu'\n"
                "with warnings.catch_warnings(record=True) as w:\n"
                "    warnings.simplefilter('always')\n"
                "    import opbridge\n"
                "print(json.dumps([str(x.message) for x in w if x.category is RuntimeWarning]))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [said.group(1) + str(info.value)]


def test_no_onnxruntime_message(monkeypatch):
    """docs/install.md quotes the error of what needs ONNX Runtime where none is installed."""
    from opbridge._ort import import_onnxruntime

    quoted = [t for t in _output_blocks(DOC / "install.md") if "needs ONNX Runtime" in t]
    assert len(quoted) == 1
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` fails as if absent
    with pytest.raises(ModuleNotFoundError) as info:
        import_onnxruntime()
    assert str(info.value) == " ".join(quoted[0].split())


def test_export_load_without_the_ops_message(tmp_path):
    """docs/install.md quotes what torch says when a saved program uses opbridge's ops and nothing
    registered them: the torch release it names, the exception and the warning before it."""
    torch = pytest.importorskip("torch")
    text = _text(DOC / "install.md")
    m = re.search(r'Without it, torch \((\d+\.\d+)\) raises "(RuntimeError): ([^"]+)" after a warning that '
                  r'names the op: "([^"]+)"', text)
    assert m, "docs/install.md no longer quotes the message in the form this test reads"
    release, exc_type, exc_text, warning = m.groups()
    if not torch.__version__.startswith(release + "."):
        pytest.skip(f"the docs quote torch {release}'s messages; this is torch {torch.__version__}")
    import opbridge.nn

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), opbridge.nn.GroupNorm(4, 8)).eval()
    torch.export.save(torch.export.export(model, (torch.randn(1, 3, 16, 16),)), tmp_path / "m.pt2")
    load = "import torch\ntry:\n    torch.export.load('m.pt2')\nexcept Exception as e:\n    print(type(e).__name__ + ': ' + str(e))\n"
    r = subprocess.run([sys.executable, "-c", load], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.stdout.startswith(f"{exc_type}: {exc_text}"), r.stdout + r.stderr
    assert warning in " ".join(r.stderr.split()), r.stderr[-3000:]


def _msda_inputs(torch, n_levels_in_locations=4):
    shapes = torch.tensor([[64, 64], [32, 32], [16, 16], [8, 8]])
    starts = torch.tensor([0, 4096, 5120, 5376])
    value = torch.randn(2, 5440, 8, 32)
    loc = torch.rand(2, 300, 8, n_levels_in_locations, 4, 2)
    weights = torch.rand(2, 300, 8, 4, 4)
    return value, shapes, starts, loc, weights


def test_ms_deform_attn_messages():
    """docs/ms_deform_attn.md quotes one torch and one ONNX Runtime message, word for word."""
    torch = pytest.importorskip("torch")
    from onnx import TensorProto, helper

    import opbridge
    import opbridge.ops

    quoted = [t for t in _output_blocks(DOC / "ms_deform_attn.md") if "must" in t]
    assert len(quoted) == 1
    torch_line, ort_line = quoted[0].strip().splitlines()
    value, shapes, starts, loc, weights = _msda_inputs(torch, n_levels_in_locations=3)
    with pytest.raises(ValueError) as info:
        opbridge.ops.ms_deform_attn(value, shapes, starts, loc, weights)
    assert str(info.value) == torch_line

    names = [("value", TensorProto.FLOAT), ("spatial_shapes", TensorProto.INT64), ("level_start_index", TensorProto.INT64),
             ("sampling_locations", TensorProto.FLOAT), ("attention_weights", TensorProto.FLOAT)]
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in names]
    node = helper.make_node("MultiScaleDeformableAttention", [n for n, _ in names], ["Y"], domain="ai.opbridge",
                            name="attn")
    graph = helper.make_graph([node], "msda", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.opbridge", 2)],
                              ir_version=9)
    sess = opbridge.InferenceSession(model.SerializeToString())
    value, shapes, starts, loc, weights = _msda_inputs(torch)
    feeds = {"value": value.numpy(), "spatial_shapes": shapes.numpy(),
             "level_start_index": np.array([0, 4096, 5121, 5376], dtype=np.int64),
             "sampling_locations": loc.numpy(), "attention_weights": weights.numpy()}
    with pytest.raises(Exception) as info:
        sess.run(None, feeds)
    assert ort_line in str(info.value)


def test_point_cloud_messages():
    """docs/point_cloud.md quotes one torch and one ONNX Runtime message, word for word."""
    torch = pytest.importorskip("torch")
    from onnx import TensorProto, helper

    import opbridge
    import opbridge.ops

    quoted = [t for t in _output_blocks(DOC / "point_cloud.md") if "must" in t]
    assert len(quoted) == 1
    torch_line, ort_line = quoted[0].strip().splitlines()
    with pytest.raises(ValueError) as info:
        opbridge.ops.knn(6, torch.rand(2, 5, 3), torch.rand(2, 3, 3))
    assert f"ValueError: {info.value}" == torch_line

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    node = helper.make_node("FurthestPointSample", ["x"], ["y"], domain="ai.opbridge", name="n", num_points=6)
    graph = helper.make_graph([node], "fps", [x], [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.opbridge", 3)],
                              ir_version=9)
    sess = opbridge.InferenceSession(model.SerializeToString())
    with pytest.raises(Exception) as info:
        sess.run(None, {"x": np.random.default_rng(0).random((2, 5, 3), dtype=np.float32)})
    assert ort_line in str(info.value)


def _group_norm_model(attrs: dict, version: int):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", "C", "H", "W"])
    node = helper.make_node("GroupNorm", ["X"], ["Y"], domain="ai.opbridge", name="gn1", **attrs)
    graph = helper.make_graph([node], "gn", [x], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.opbridge", version)],
                             ir_version=9).SerializeToString()


def test_group_norm_messages():
    """README.md's example of an ORT error status, and docs/group_norm.md's error for an unknown
    activation in torch and in ORT (at session creation)."""
    import opbridge

    readme = _text(README)
    m = re.search(r"such as `(ai\.opbridge::GroupNorm \(node 'gn1'\): [^`]+)`", readme)
    assert m
    sess = opbridge.InferenceSession(_group_norm_model({"num_groups": 4}, 1))
    with pytest.raises(Exception) as info:
        sess.run(None, {"X": np.random.default_rng().standard_normal((2, 6, 4, 4)).astype(np.float32)})
    assert m.group(1) in str(info.value)

    page = _text(DOC / "group_norm.md")
    m = re.search(r"An unknown value is the same error everywhere: `([^`]+)` \(torch and its fake kernel: "
                  r"`ValueError: (opbridge::group_norm): \.\.\.`; ORT, at session creation: "
                  r"`(ai\.opbridge::GroupNorm \(node 'gn1'\)): \.\.\.`\)", page)
    assert m, "docs/group_norm.md no longer quotes the messages in the form this test reads"
    message, torch_label, ort_label = m.groups()
    with pytest.raises(Exception) as info:
        opbridge.InferenceSession(_group_norm_model({"num_groups": 2, "activation": "relu"}, 2))
    assert f"{ort_label}: {message}" in str(info.value)
    torch = pytest.importorskip("torch")
    import opbridge.ops

    with pytest.raises(ValueError) as info:
        opbridge.ops.group_norm(torch.randn(2, 4, 3), 2, activation="relu")
    assert str(info.value) == f"{torch_label}: {message}"


def test_check_op_report_format():
    """docs/cpp.md's example report has the lines check_op writes: its header, a forward failure
    with float32's tolerances and numbers as check_op formats them, a gradcheck check."""
    torch = pytest.importorskip("torch")
    import opbridge.ops  # noqa: F401
    import opbridge.testing

    (quoted,) = [t for t in _output_blocks(DOC / "cpp.md") if t.startswith("check_op(")]
    header, forward, grad = quoted.rstrip("\n").splitlines()

    def wrong_reference(x, num_groups, weight=None, bias=None, eps=1e-5, activation="none"):
        x = np.asarray(x, dtype=np.float64)
        g = x.reshape(x.shape[0], num_groups, -1)
        y = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)
        return y.reshape(x.shape) * 1.001  # off by 0.1%: fails float32's tolerance

    report = str(opbridge.testing.check_op("opbridge::group_norm", wrong_reference, [(torch.randn(2, 4, 3), 2)],
                                           export=False, cuda=False, raise_on_failure=False))
    lines = report.splitlines()
    head = r"check_op\([\w:]+\): \d+ failed, \d+ passed, \d+ skipped"
    assert re.fullmatch(head, lines[0]) and re.fullmatch(head, header), (lines[0], header)
    num = r"(-?[0-9.e+-]+)"
    fail = (r"  FAIL  forward float32, sample 0: \d+ of \d+ elements differ; worst at index \((?:\d+, )*\d+\): "
            rf"got {num}, expected {num} \(\|diff\| {num} > atol {num} \+ rtol {num} \* \|expected\|\)")
    real = [re.fullmatch(fail, line) for line in lines]
    real = [m for m in real if m]
    assert real, report
    doc = re.fullmatch(fail, forward)
    assert doc, forward
    assert doc.groups()[3:] == real[0].groups()[3:], "float32's tolerances"
    for v in doc.groups()[:2]:
        assert f"{float(v):.8g}" == v, f"{v}: check_op writes values with 8 significant digits"
    assert f"{float(doc.group(3)):.3g}" == doc.group(3)
    assert grad.startswith("  FAIL  gradcheck, sample 0: ") and "  ok    gradcheck, sample 0" in lines, report


def test_cuda_check_stages_exist():
    """docs/cuda.md lists scripts/cuda_check.sh's stages: each is one the script has."""
    script = (REPO / "scripts" / "cuda_check.sh").read_text()
    (block,) = [b for b in blocks(DOC / "cuda.md") if "scripts/cuda_check.sh" in b.text]
    named = set()
    for line in block.text.splitlines():
        words = line.split("#")[0].split()
        if words[:1] != ["scripts/cuda_check.sh"]:
            continue
        rest = iter(words[1:])
        for w in rest:
            if w == "pack":
                next(rest)  # its file
            if not w.isdigit() and w != "--":
                named.add(w)
    assert named >= {"prepare", "build", "test", "memcheck", "bench", "par", "pack"}
    # par and pack are the dispatcher's own words (a case branch), the others stage functions.
    missing = sorted(w for w in named if f"stage_{w}()" not in script and f"    {w})" not in script)
    assert not missing, f"docs/cuda.md names stages scripts/cuda_check.sh lacks: {missing}"


# ---- CUDA: the launchers' signatures and GroupNorm's CUDA paragraph -----------------------------

def _launcher_params(name: str) -> list[tuple[str, str]]:
    """(type, name) of each parameter of `cudaError_t name(...)` as an ops/*/*.cuh declares it."""
    for header in sorted((REPO / "ops").glob("*/*.cuh")):
        m = re.search(rf"cudaError_t\s+{name}\s*\(([^)]*)\)\s*;", header.read_text())
        if m:
            params = [" ".join(p.split()) for p in m.group(1).split(",")]
            return [(p.rsplit(" ", 1)[0], p.rsplit(" ", 1)[1]) for p in params]
    raise AssertionError(f"no declaration of {name} in ops/*/*.cuh")


def test_cuda_launcher_signatures():
    """docs/cuda.md writes each launcher's parameters in order, by name or by type
    (`GroupNormDims`, `Activation`); `bytes` is `workspace_bytes`."""
    page = _text(DOC / "cuda.md")
    quoted = re.findall(r"`(launch_\w+)<T>\(([^)`]*)\)`", page)
    assert {n for n, _ in quoted} >= {"launch_group_norm", "launch_inverse"}
    for name, args in quoted:
        params = _launcher_params(name)
        words = [a.strip() for a in args.split(",")]
        assert len(words) == len(params), f"docs/cuda.md: {name} has {len(params)} parameters: {params}"
        for w, (ptype, pname) in zip(words, params):
            assert w in (pname, pname.removeprefix("workspace_")) or re.search(rf"\b{w}\b", ptype), \
                f"docs/cuda.md: {name}: `{w}` where the declaration has `{ptype} {pname}`"


def test_group_norm_cuda_paragraph():
    """docs/group_norm.md's CUDA paragraph: the launcher (ops/group_norm/group_norm.cuh) takes the
    parameter struct it names, which the public header declares with the CPU kernel's sizes and
    activation. What the paragraph says the code does is tested by running it: the activation and
    both layouts through the CUDA kernel file, tests/cuda_ops/test_cuda_host.py (emulated device) and
    tests/cuda_ops/test_cuda.py (GPU); channels-last kept channels-last by the torch op,
    tests/ops/test_group_norm_layouts.py."""
    page = _text(DOC / "group_norm.md")
    m = re.search(r"CUDA: the launcher takes `(\w+)` \(the CPU kernel's `(\w+)` and `(\w+)`", page)
    assert m, "docs/group_norm.md no longer states the launcher's arguments in the form this test reads"
    types = {t for t, _ in _launcher_params("launch_group_norm")}
    assert f"const {m.group(1)}&" in types, types
    cpu = (REPO / "ops" / "group_norm" / "group_norm.h").read_text()
    params = re.search(rf"struct {m.group(1)} {{(.*?)}};", cpu, flags=re.S)
    assert params and all(re.search(rf"\b{t}\b", params.group(1)) for t in m.groups()[1:]), "the struct holds both"


def test_export_memory_refusal_message(monkeypatch):
    """docs/optimize.md quotes export's refusal of a model the memory available cannot hold: the
    model that mixes every kind of large tensor at 0.6 GB, TorchScript exporter, a limit of 1G."""
    pytest.importorskip("torch")
    import importlib.util

    import opbridge.onnx
    from opbridge import _memory

    spec = importlib.util.spec_from_file_location("_large_model", REPO / "benchmarks" / "benchmarks" / "_large_model.py")
    large = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, large)
    spec.loader.exec_module(large)
    (quoted,) = [t for t in _output_blocks(DOC / "optimize.md") if t.startswith("opbridge.onnx.export: exporting")]
    model, inputs = large.build_kind("mixed", 0.6)
    monkeypatch.setenv(_memory.ENV, "1G")
    with pytest.raises(MemoryError) as e:
        opbridge.onnx.export(model, inputs, "never-written.onnx", dynamo=False)
    assert str(e.value) == " ".join(quoted.split())
