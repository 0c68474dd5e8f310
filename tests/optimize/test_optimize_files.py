"""`opbridge optimize` and its files: --max-memory refuses before the tensors are read, inputs
that are not ONNX or whose external data is missing, truncated or outside the model's folder,
a full disk (before and while writing): exit status 2 and one message naming the file and the
reason; the input files are never modified, and the output appears only when complete."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

import opbridge
from opbridge import _optimize
from opbridge.cli import main
from helpers.optimize_support import group_norm_decomposition_with_table
from helpers.reference import group_norm as ref_group_norm

C, G = 64, 8


def _model(rng, table_rows=16):
    return group_norm_decomposition_with_table(rng, C, G, (3, 5), table_rows, name="files")


def _save(model, folder, name="m.onnx", external=True):
    os.makedirs(folder, exist_ok=True)
    path = str(folder / name)
    if external:
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location="weights.bin", size_threshold=1024)
    else:
        onnx.save(model, path)
    return path


def _digests(folder):
    """Name -> (sha256, mtime) of every file in folder: to show nothing was modified."""
    out = {}
    for name in sorted(os.listdir(folder)):
        p = os.path.join(folder, name)
        with open(p, "rb") as f:
            out[name] = (hashlib.sha256(f.read()).hexdigest(), os.stat(p).st_mtime_ns)
    return out


def _cli(capsys, *args):
    code = main(["optimize", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _check_output(path, rng, w, b, table):
    sess = opbridge.InferenceSession(path)
    x = rng.standard_normal((2, C, 3, 5)).astype(np.float32)
    idx = np.array([5, 0, 15], np.int64)
    y, e = sess.run(None, {"x": x, "idx": idx})
    np.testing.assert_allclose(y, ref_group_norm(x, G, w, b), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(e, table[idx])


# ---------------------------------------------------------------------------------------------
# --max-memory
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("8G", 8 << 30), ("8g", 8 << 30), ("8GiB", 8 << 30), ("8GB", 8 * 10**9), ("512M", 512 << 20),
    ("1.5G", int(1.5 * 2**30)), ("2048", 2048), ("64k", 64 << 10), ("1 TB", 10**12),
])
def test_sizes(text, expected):
    assert _optimize.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "G", "-1G", "0", "8X", "8GG", "nan", "inf", "1e400"])
def test_bad_sizes_are_refused_with_the_option_named(tmp_path, rng, capsys, text):
    src = _save(_model(rng)[0], tmp_path / "in")
    code, _, err = _cli(capsys, src, tmp_path / "out" / "o.onnx", f"--max-memory={text}")
    assert code == 2 and "--max-memory expects a size" in err and repr(text) in err
    assert not (tmp_path / "out").exists()


def test_max_memory_refuses_before_the_tensors_are_read(tmp_path, rng, capsys, monkeypatch):
    model = _model(rng, table_rows=1024)[0]  # 4 MiB table in weights.bin
    src = _save(model, tmp_path / "in")
    before = _digests(tmp_path / "in")

    def no_loading(path):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(_optimize, "load", no_loading)
    dst = tmp_path / "out" / "o.onnx"
    code, out, err = _cli(capsys, src, dst, "--max-memory", "1M")
    assert code == 2, out + err
    assert src in err and "--max-memory" in err and "needs about" in err and "nothing was read or written" in err
    assert not (tmp_path / "out").exists()
    assert _digests(tmp_path / "in") == before


def test_max_memory_judges_a_large_single_file_by_its_size(tmp_path, rng, capsys, monkeypatch):
    """A model file past GRAPH_ONLY_BYTES is not even parsed to be refused."""
    monkeypatch.setattr(_optimize, "GRAPH_ONLY_BYTES", 1 << 20)
    src = _save(_model(rng, table_rows=512)[0], tmp_path / "in", external=False)  # 2 MiB, one file
    assert os.path.getsize(src) > 1 << 20

    def no_parsing(*args, **kwargs):
        raise AssertionError("the model was read")

    monkeypatch.setattr(_optimize, "model_files", no_parsing)
    monkeypatch.setattr(_optimize, "load", no_parsing)
    code, _, err = _cli(capsys, src, tmp_path / "o.onnx", "--max-memory", "2M")
    assert code == 2 and "needs about" in err and src in err
    assert not (tmp_path / "o.onnx").exists()


def test_estimate_covers_an_optimize_run_and_enough_memory_passes(tmp_path, rng, capsys):
    model, w, b, table = _model(rng, table_rows=1024)
    src = _save(model, tmp_path / "in")
    files = _optimize.model_files(src)
    assert files.external and files.external_bytes >= 1024 * 1024 * 4
    need = _optimize.estimated_peak(files.tensor_bytes, inline_input=False, external_output=True)
    assert need >= _optimize.BASE_BYTES + files.tensor_bytes
    dst = tmp_path / "out" / "o.onnx"
    code, out, err = _cli(capsys, src, dst, "--max-memory", str(need), "--dim", "K=3")
    assert code == 0, out + err
    _check_output(str(dst), rng, w, b, table)


def test_default_limit_is_the_memory_available(tmp_path, rng, capsys, monkeypatch):
    src = _save(_model(rng, table_rows=1024)[0], tmp_path / "in")
    monkeypatch.setattr(_optimize, "available_memory", lambda: 1 << 20)
    code, _, err = _cli(capsys, src, tmp_path / "o.onnx")
    assert code == 2 and "by default the memory available now" in err


# ---------------------------------------------------------------------------------------------
# Inputs that cannot be read
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b"\x00\x01 not a model", b"ir_version: 9\n", b"\x08\x09"],
                         ids=["empty", "garbage", "text", "no-graph"])
def test_a_file_that_is_not_onnx(tmp_path, capsys, content):
    src = tmp_path / "bad.onnx"
    src.write_bytes(content)
    code, out, err = _cli(capsys, src, tmp_path / "o.onnx")
    assert code == 2, out + err
    assert f"cannot read {src}: it is not an ONNX model" in err
    assert sorted(os.listdir(tmp_path)) == ["bad.onnx"]


def test_missing_external_data_names_the_data_file(tmp_path, rng, capsys):
    src = _save(_model(rng)[0], tmp_path)
    os.remove(tmp_path / "weights.bin")
    code, _, err = _cli(capsys, src, tmp_path / "o.onnx")
    assert code == 2 and str(tmp_path / "weights.bin") in err and "does not exist" in err
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]


def test_truncated_external_data_names_the_data_file(tmp_path, rng, capsys):
    src = _save(_model(rng)[0], tmp_path)
    data = tmp_path / "weights.bin"
    size = os.path.getsize(data)
    with open(data, "r+b") as f:
        f.truncate(size - 100)
    before = _digests(tmp_path)
    code, _, err = _cli(capsys, src, tmp_path / "o.onnx")
    assert code == 2 and str(data) in err and "truncated" in err
    assert _digests(tmp_path) == before


def test_external_data_outside_the_models_folder_is_refused(tmp_path, rng, capsys):
    model = _model(rng)[0]
    src = _save(model, tmp_path / "sub")
    proto = onnx.load(src, load_external_data=False)
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../weights.bin"
    os.replace(tmp_path / "sub" / "weights.bin", tmp_path / "weights.bin")
    onnx.save(proto, src)
    code, _, err = _cli(capsys, src, tmp_path / "o.onnx")
    assert code == 2 and "'../weights.bin'" in err and "is outside the model's folder" in err and "'table'" in err


# ---------------------------------------------------------------------------------------------
# Writing: a full disk, temporary names
# ---------------------------------------------------------------------------------------------


def test_an_output_folder_without_room_is_refused_before_reading(tmp_path, rng, capsys, monkeypatch):
    src = _save(_model(rng, table_rows=1024)[0], tmp_path / "in")

    class Usage:
        free = 1000

    monkeypatch.setattr(_optimize.shutil, "disk_usage", lambda path: Usage)
    monkeypatch.setattr(_optimize, "load", lambda path: pytest.fail("the model was loaded"))
    dst = tmp_path / "out" / "o.onnx"
    code, _, err = _cli(capsys, src, dst, "--max-memory", "8G")
    assert code == 2 and f"cannot write {dst}" in err and "free in" in err
    assert not (tmp_path / "out").exists()


_FULL_DISK_CHILD = """
import resource, sys
from opbridge.cli import main
# Files may not grow past 1 MiB: a write beyond fails with EFBIG, as a full disk fails with ENOSPC
# (Python ignores SIGXFSZ, so the write returns the error).
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
sys.exit(main(["optimize", sys.argv[1], sys.argv[2], "--max-memory", "8G"]))
"""


def test_a_write_that_fails_midway_leaves_nothing_and_names_the_file(tmp_path, rng):
    """The output's data file (4 MiB) cannot be written completely: exit status 2, a message
    naming the output and the reason, no output or scratch file left, the input untouched."""
    src = _save(_model(rng, table_rows=1024)[0], tmp_path / "in")
    before = _digests(tmp_path / "in")
    dst = tmp_path / "out" / "o.onnx"
    r = subprocess.run([sys.executable, "-c", _FULL_DISK_CHILD, src, str(dst)], capture_output=True, text=True)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"cannot write {dst}" in r.stderr and "File too large" in r.stderr, r.stderr
    assert os.listdir(tmp_path / "out") == []
    assert _digests(tmp_path / "in") == before


def test_the_output_appears_only_when_complete(tmp_path, rng, capsys, monkeypatch):
    """While the check runs, the output exists only in a hidden scratch folder beside it; the
    input is never written to."""
    model, w, b, table = _model(rng, table_rows=64)
    src = _save(model, tmp_path / "in")
    before = _digests(tmp_path / "in")
    dst = tmp_path / "out" / "o.onnx"
    seen = {}
    check = _optimize.check_against

    def watching(original, rewritten, **kwargs):
        seen["out"] = sorted(os.listdir(tmp_path / "out"))
        seen["rewritten"] = sorted(os.listdir(os.path.dirname(rewritten)))
        return check(original, rewritten, **kwargs)

    monkeypatch.setattr(_optimize, "check_against", watching)
    code, out, err = _cli(capsys, src, dst, "--dim", "K=3")
    assert code == 0, out + err
    assert len(seen["out"]) == 1 and seen["out"][0].startswith(".opbridge-optimize-")
    assert seen["rewritten"] == ["o.onnx", "o.onnx.data"]
    assert sorted(os.listdir(tmp_path / "out")) == ["o.onnx", "o.onnx.data"]
    assert _digests(tmp_path / "in") == before
    _check_output(str(dst), rng, w, b, table)


def test_a_large_single_file_input_gets_external_data(tmp_path, rng, capsys, monkeypatch):
    """Past AUTO_EXTERNAL_BYTES (lowered here) the output keeps its tensors in OUT.data, so that
    writing it needs no serialized copy of the model."""
    monkeypatch.setattr(_optimize, "AUTO_EXTERNAL_BYTES", 1 << 20)
    model, w, b, table = _model(rng, table_rows=512)  # 2 MiB
    src = _save(model, tmp_path / "in", external=False)
    dst = tmp_path / "out" / "o.onnx"
    code, out, err = _cli(capsys, src, dst, "--dim", "K=3")
    assert code == 0, out + err
    assert sorted(os.listdir(tmp_path / "out")) == ["o.onnx", "o.onnx.data"]
    _check_output(str(dst), rng, w, b, table)
