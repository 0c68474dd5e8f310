"""Models past protobuf's 2 GB limit: export (both exporters), the loader, `opbridge check` and
`opbridge optimize` with external data.

The > 2 GB model is cheap to build: three 737 MB tables that are only gathered from (so the
exporters cannot fold them away), allocated with numpy.zeros (calloc: untouched pages cost no
memory) with a few random rows written. Writing the 2.2 GB files is what takes time; the test
deletes each file as soon as it is done with it so that the machine's dirty-page limit is not hit.
"""

from __future__ import annotations

import io
import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import opbridge
from opbridge import _optimize
from opbridge._check import check
from opbridge.cli import main
from helpers.optimize_support import group_norm_decomposition_with_table
from helpers.reference import group_norm as ref_group_norm

TWO_GB = 2**31
ROWS, COLS = 45_000, 4096  # float32: 737 MB per table, 2.21 GB for three
LIVE_ROWS = 8  # rows with random values; the rest stay zero (and unallocated)


def _data_files(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith(".data"))


def _total_size(folder):
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))


# ---------------------------------------------------------------------------------------------
# torch-free: a hand-built model with external data through check, the loader and optimize
# ---------------------------------------------------------------------------------------------


def _external_model(tmp_path, rng, name="m.onnx"):
    """A GroupNorm decomposition whose weight and bias (2 KiB each) and a 64 KiB table live in
    external data (ORT needs the small shape tensors inline)."""
    model, w, b, table = group_norm_decomposition_with_table(rng, 512, 32, (2, 3), name="ext")
    path = str(tmp_path / name)
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=1024)
    return path, w, b, table


def test_optimize_keeps_external_data(tmp_path, rng, capsys):
    src, w, b, table = _external_model(tmp_path, rng)
    out_dir = tmp_path / "out"
    dst = str(out_dir / "opt.onnx")
    assert main(["optimize", src, dst, "--dim", "K=3"]) == 0, capsys.readouterr().out
    assert _data_files(out_dir) == ["opt.onnx.data"]
    model = onnx.load(dst, load_external_data=False)
    external = {t.name for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert {"table", "opt_w", "opt_b"} <= external or {"table"} <= external and len(external) >= 3, external
    assert {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"} == \
        {"opt.onnx.data"}
    # The folder of the input is untouched: no scratch files, its data file intact.
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "out", "weights.bin"]
    sess = opbridge.InferenceSession(dst)
    x = rng.standard_normal((2, 512, 2, 3)).astype(np.float32)
    idx = np.array([3, 0, 15], np.int64)
    y, e = sess.run(None, {"x": x, "idx": idx})
    np.testing.assert_allclose(y, ref_group_norm(x, 32, w, b), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(e, table[idx])


def test_check_and_loader_read_external_data(tmp_path, rng):
    src, _, _, table = _external_model(tmp_path, rng)
    buf = io.StringIO()
    report = check(src, dims={"K": 2}, out=buf)
    assert report.ok, buf.getvalue()
    e = opbridge.InferenceSession(src).run(["e"], {"x": np.ones((1, 512, 2, 3), np.float32),
                                                   "idx": np.array([7], np.int64)})[0]
    np.testing.assert_array_equal(e, table[[7]])


def test_optimize_of_a_model_whose_data_file_is_missing_is_an_error(tmp_path, rng, capsys):
    src, _, _, _ = _external_model(tmp_path, rng)
    os.remove(tmp_path / "weights.bin")
    code = main(["optimize", src, str(tmp_path / "o.onnx")])
    captured = capsys.readouterr()
    assert code == 2 and "weights.bin" in captured.err, captured.out + captured.err
    assert not (tmp_path / "o.onnx").exists()


# ---------------------------------------------------------------------------------------------
# torch: export with external data
# ---------------------------------------------------------------------------------------------


def _big_module(torch, rng, rows=ROWS, cols=COLS):
    class Big(torch.nn.Module):
        """A GroupNorm + SiLU (something for optimize to rewrite) and three large tables that
        are only gathered from."""

        def __init__(self):
            super().__init__()
            for i in range(3):
                table = np.zeros((rows, cols), np.float32)  # calloc: unwritten pages cost nothing
                table[:LIVE_ROWS] = rng.standard_normal((LIVE_ROWS, cols))
                self.register_buffer(f"table{i}", torch.from_numpy(table))
            self.gn = torch.nn.GroupNorm(2, 4)

        def forward(self, x, idx):
            e = self.table0[idx] + self.table1[idx] + self.table2[idx]
            return torch.nn.functional.silu(self.gn(x)), e

    return Big().eval()


def _inputs(torch, rng):
    x = torch.from_numpy(rng.standard_normal((2, 4, 3, 3)).astype(np.float32))
    idx = torch.from_numpy(rng.integers(0, LIVE_ROWS, 5).astype(np.int64))
    return x, idx


def _run_exported(torch, path, module, x, idx):
    sess = opbridge.InferenceSession(path)
    names = [i.name for i in sess.get_inputs()]
    got = sess.run(None, {names[0]: x.numpy(), names[1]: idx.numpy()})
    with torch.no_grad():
        _, e = module(x, idx)
    np.testing.assert_array_equal(got[1], e.numpy())
    return got


@pytest.mark.torch
def test_export_over_2gb_writes_external_data_and_everything_reads_it(tmp_path, rng):
    """dynamo export of a 2.2 GB model (automatic external data), then the loader, `opbridge
    check` and `opbridge optimize` on it. About 15-30 s, mostly writing 2 x 2.2 GB."""
    torch = pytest.importorskip("torch")
    module = _big_module(torch, rng)
    x, idx = _inputs(torch, rng)
    folder = tmp_path / "export"
    path = str(folder / "big.onnx")
    os.makedirs(folder)
    proto = opbridge.onnx.export(module, (x, idx), path, fuse=False, dynamic_batch=False)
    assert _data_files(folder) == ["big.onnx.data"]
    assert os.path.getsize(folder / "big.onnx.data") > TWO_GB
    assert os.path.getsize(path) < 1 << 20  # the graph alone
    # The returned proto refers to the data instead of holding it.
    assert proto.ByteSize() < 1 << 20
    _run_exported(torch, path, module, x, idx)

    buf = io.StringIO()
    assert check(path, out=buf).ok, buf.getvalue()

    out = io.StringIO()
    report = _optimize.optimize(path, str(tmp_path / "opt" / "big.onnx"), silu=False, out=out)
    assert report.ok, out.getvalue()
    shutil.rmtree(folder)  # the input is no longer needed: its pages need not reach the disk
    assert _data_files(tmp_path / "opt") == ["big.onnx.data"]
    assert os.path.getsize(tmp_path / "opt" / "big.onnx.data") > TWO_GB
    optimized = onnx.load(str(tmp_path / "opt" / "big.onnx"), load_external_data=False)
    assert any(n.domain == opbridge.DOMAIN for n in optimized.graph.node)
    _run_exported(torch, str(tmp_path / "opt" / "big.onnx"), module, x, idx)


@pytest.mark.torch
@pytest.mark.slow
def test_torchscript_export_over_2gb_writes_external_data(tmp_path, rng):
    """The TorchScript exporter itself needs about a minute for 2.2 GB of tensors (its shape
    inference copies them), hence slow; test_torchscript_external_data_on_request covers the same
    code path of opbridge in CI."""
    torch = pytest.importorskip("torch")
    module = _big_module(torch, rng)
    x, idx = _inputs(torch, rng)
    path = str(tmp_path / "big.onnx")
    opbridge.onnx.export(module, (x, idx), path, dynamo=False, fuse=False, dynamic_batch=False)
    assert sorted(os.listdir(tmp_path)) == ["big.onnx", "big.onnx.data"]  # no per-tensor files, no scratch
    assert os.path.getsize(tmp_path / "big.onnx.data") > TWO_GB
    _run_exported(torch, path, module, x, idx)


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [True, False])
def test_external_data_on_request(tmp_path, rng, dynamo):
    torch = pytest.importorskip("torch")
    module = _big_module(torch, rng, rows=64, cols=512)  # 128 KiB tables
    x, idx = _inputs(torch, rng)
    path = str(tmp_path / "m.onnx")
    proto = opbridge.onnx.export(module, (x, idx), path, dynamo=dynamo, external_data=True, dynamic_batch=False)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    assert os.path.getsize(tmp_path / "m.onnx.data") >= 3 * 64 * 512 * 4
    assert any(t.data_location == TensorProto.EXTERNAL for t in proto.graph.initializer)
    got = _run_exported(torch, path, module, x, idx)
    with torch.no_grad():
        y, _ = module(x, idx)
    # fuse (default) made the GroupNorm + SiLU one node; compare the GroupNorm part where ORT
    # applies the activation (see optimize_support.needs_ort_silu), else only the structure.
    gns = [n for n in onnx.load(path, load_external_data=False).graph.node if n.domain == opbridge.DOMAIN]
    assert len(gns) == 1
    from helpers.optimize_support import ort_applies_silu

    if ort_applies_silu():
        np.testing.assert_allclose(got[0], y.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [True, False])
def test_small_models_stay_in_one_file(tmp_path, rng, dynamo):
    torch = pytest.importorskip("torch")
    module = _big_module(torch, rng, rows=64, cols=512)
    x, idx = _inputs(torch, rng)
    path = str(tmp_path / "m.onnx")
    opbridge.onnx.export(module, (x, idx), path, dynamo=dynamo, dynamic_batch=False)
    assert os.listdir(tmp_path) == ["m.onnx"]
    _run_exported(torch, path, module, x, idx)


@pytest.mark.torch
def test_automatic_threshold_counts_the_modules_tensors(rng):
    """The TorchScript path decides before exporting, from the module's parameters and buffers
    (meta tensors here: sizes without memory)."""
    torch = pytest.importorskip("torch")
    from opbridge.onnx import _external_data

    class M(torch.nn.Module):
        def __init__(self, rows):
            super().__init__()
            self.a = torch.nn.Parameter(torch.empty(rows, COLS, device="meta"))
            self.register_buffer("b", torch.empty(rows, COLS, device="meta"))
            self.c = self.a  # shared: counted once

    big, small = M(70_000), M(1000)
    assert _external_data.state_bytes(big) == 2 * 70_000 * COLS * 4 > TWO_GB
    assert _external_data.wants_external(None, _external_data.state_bytes(big))
    assert not _external_data.wants_external(None, _external_data.state_bytes(small))
    assert not _external_data.wants_external(False, _external_data.state_bytes(big))
    assert _external_data.wants_external(True, 0)
    with pytest.raises(TypeError, match="external_data must be True, False or None"):
        _external_data.wants_external("yes", 0)


@pytest.mark.torch
def test_external_data_true_without_a_file_name_is_an_error(rng):
    torch = pytest.importorskip("torch")
    module = _big_module(torch, rng, rows=16, cols=64)
    with pytest.raises(ValueError, match="external_data=True needs a file name"):
        opbridge.onnx.export(module, _inputs(torch, rng), None, external_data=True, dynamic_batch=False)
