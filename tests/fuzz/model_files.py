"""Fuzzing `opbridge check` and `opbridge optimize` with model files: mutations of the suite's
models and of the ONNX models onnx ships with its backend tests (onnx/backend/test/data), each case
run in a child process of its own with a time and a memory limit.

    python -m tests.fuzz.model_files --cases 2000 --seed 7 [--record cases.jsonl] [--keep DIR]

A case: a seed model (with its external data, when it has some) is copied into a folder ``in/``
of the case's folder, mutated (truncated; bytes flipped; fields swapped between nodes and tensors;
huge and negative dims; the graph nested in If nodes; attributes whose type lies; tensors moved to
external data entries that point outside the folder, through links, at a FIFO, past the file's end,
with offsets and lengths that are not integers, that overlap), and ``opbridge check in/model.onnx``
then ``opbridge optimize in/model.onnx out/model.onnx`` run on it, each forked from a process that
has imported opbridge already (so that a run costs a fork, not an interpreter start), with its own
TMPDIR, an address-space-independent memory limit (RLIMIT_DATA: what it may allocate), a file
size limit and a wall-clock limit. A canary file sits beside ``in/``.

Verdict of a run: its exit status and the first line of what it printed (recorded with --record;
the same seed gives the same cases). A finding: a Python traceback, a crash (a signal), a hang,
an exit status other than 0, 1 or 2, a file written, changed or removed outside ``out/`` (or left
in TMPDIR), files left in ``out/`` by a run that failed, the canary opened (inotify), or the two
commands disagreeing about the file (``verdict_disagreement``). Exit status: 0 when no case made a
finding, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import faulthandler
import json
import math
import os
import resource
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from pathlib import Path

# Before numpy: a forked child must not inherit a BLAS thread pool it cannot use.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

_TESTS = str(Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

COMMANDS = ("check", "optimize")
TIMEOUT_S = 60
# What a case may allocate beyond what the forked process holds already.
MEMORY_LIMIT = 2 << 30
FILE_SIZE_LIMIT = 256 << 20
CANARY = "canary.bin"
# ONNX Runtime (1.31) writes a session id to $TMPDIR/.ses when a process makes its first session.
ORT_OWN_FILES = (os.path.join("tmp", ".ses"),)
MODEL = "model.onnx"


# --------------------------------------------------------------------------------------------
# Seed models
# --------------------------------------------------------------------------------------------


def _save(model: onnx.ModelProto, folder: Path, external: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if external:
        onnx.save(model, str(folder / MODEL), save_as_external_data=True, all_tensors_to_one_file=True,
                  location="weights.bin", size_threshold=1024)
    else:
        onnx.save(model, str(folder / MODEL))


def _suite_models(root: Path) -> list[Path]:
    """The suite's own kinds of model: GroupNorm decompositions optimize rewrites (with a table it
    leaves alone, inline and in external data), opbridge nodes, a subgraph, com.microsoft's GroupNorm."""
    import opbridge
    from helpers.onnx_models import IR_VERSION, single_node_model
    from helpers.optimize_support import group_norm_decomposition_with_table

    rng = np.random.default_rng(0)
    out = []
    model = group_norm_decomposition_with_table(rng, 8, 4, [3, 3], table_rows=4)[0]
    for external in (False, True):
        folder = root / f"suite_gn_decomposition{'_external' if external else ''}"
        _save(model, folder, external)
        out.append(folder)
    gn = single_node_model("GroupNorm", opbridge.DOMAIN, [("X", np.float32, ["N", 8, 4]),
                                                          ("scale", np.float32, [8]), ("bias", np.float32, [8])],
                           attrs={"num_groups": 4, "epsilon": 1e-5}, domain_version=1)
    _save(gn, root / "suite_opbridge_group_norm")
    out.append(root / "suite_opbridge_group_norm")
    inv = single_node_model("Inverse", opbridge.DOMAIN, [("X", np.float32, ["N", 3, 3])])
    _save(inv, root / "suite_opbridge_inverse")
    out.append(root / "suite_opbridge_inverse")
    ms = single_node_model("GroupNorm", "com.microsoft", [("X", np.float32, [2, 4, 4, 8]),
                                                          ("gamma", np.float32, [8]), ("beta", np.float32, [8])],
                           attrs={"groups": 4, "activation": 1, "epsilon": 1e-5, "channels_last": 1})
    _save(ms, root / "suite_ms_group_norm")
    out.append(root / "suite_ms_group_norm")
    # An If whose branches hold a GroupNorm decomposition each (subgraphs, outer-scope reads).
    branch_nodes = [helper.make_node("Reshape", ["x", "gs"], ["r"]),
                    helper.make_node("InstanceNormalization", ["r", "ones", "zeros"], ["n"]),
                    helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["n", "s"], ["y_b"])]
    branch = helper.make_graph(branch_nodes, "branch", [], [helper.make_tensor_value_info("y_b", TensorProto.FLOAT,
                                                                                        None)])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)], "with_if",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 3]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 3])],
        initializer=[numpy_helper.from_array(np.array([0, 4, -1], np.int64), "gs"),
                     numpy_helper.from_array(np.ones(4, np.float32), "ones"),
                     numpy_helper.from_array(np.zeros(4, np.float32), "zeros")])
    _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION),
          root / "suite_if")
    out.append(root / "suite_if")
    return out


def _onnx_backend_models(root: Path) -> list[Path]:
    """Every model.onnx of onnx's backend test data shipped in the onnx package (simple,
    pytorch-operator, pytorch-converted, light), each copied into a folder of its own."""
    data = Path(onnx.__file__).parent / "backend" / "test" / "data"
    out = []
    for path in sorted(data.glob("*/*/model.onnx")) + sorted(data.glob("light/*.onnx")):
        if path.stat().st_size > 4 << 20:
            continue
        folder = root / f"onnx_{path.parent.parent.name}_{path.parent.name if path.name == MODEL else path.stem}"
        folder.mkdir(parents=True)
        shutil.copyfile(path, folder / MODEL)
        out.append(folder)
    return out


def seed_models(root: Path) -> list[Path]:
    return _suite_models(root) + _onnx_backend_models(root)


# --------------------------------------------------------------------------------------------
# Mutations: each takes (rng, the case's in/ folder) and returns what it did
# --------------------------------------------------------------------------------------------

HUGE_DIMS = [-1, -2, -(2**63), 0, 2**31, 2**40, 2**62, 2**63 - 1, 3 * 2**30]


def _load(folder: Path) -> onnx.ModelProto:
    return onnx.load(str(folder / MODEL), load_external_data=False)


def _store(model: onnx.ModelProto, folder: Path) -> None:
    (folder / MODEL).write_bytes(model.SerializeToString())


def _all_nodes(model):
    from opbridge.onnx._reader import graphs

    return [n for g in graphs(model) for n in g.node]


def _all_tensors(model):
    from opbridge.onnx._reader import tensors

    return [t for t, _ in tensors(model)]


def _value_infos(model):
    from opbridge.onnx._reader import graphs

    return [vi for g in graphs(model) for vi in (*g.input, *g.output, *g.value_info) if vi.type.HasField("tensor_type")]


def truncate(rng, folder: Path) -> str:
    data = (folder / MODEL).read_bytes()
    n = int(rng.integers(0, max(1, len(data))))
    (folder / MODEL).write_bytes(data[:n])
    return f"truncated to {n} of {len(data)} bytes"


def flip_bytes(rng, folder: Path) -> str:
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.is_symlink())
    target = files[int(rng.integers(len(files)))] if len(files) > 1 and rng.random() < 0.2 else folder / MODEL
    data = bytearray(target.read_bytes())
    if not data:
        return "nothing to flip"
    k = int(rng.integers(1, 17))
    for _ in range(k):
        i = int(rng.integers(len(data)))
        data[i] ^= 1 << int(rng.integers(8))
    target.write_bytes(bytes(data))
    return f"{k} bits flipped in {target.name}"


def swap_fields(rng, folder: Path) -> str:
    """Swaps one kind of field between two nodes or tensors (the graph stays parseable)."""
    model = _load(folder)
    nodes, tensors = _all_nodes(model), _all_tensors(model)
    what = ["op_type", "inputs", "outputs", "attributes", "domain", "tensor dims", "tensor types", "tensor names",
            "io names"][int(rng.integers(9))]
    if what in ("op_type", "inputs", "outputs", "attributes", "domain") and len(nodes) >= 2:
        a, b = (nodes[int(i)] for i in rng.choice(len(nodes), 2, replace=False))
        if what == "op_type":
            a.op_type, b.op_type = b.op_type, a.op_type
        elif what == "domain":
            a.domain, b.domain = b.domain, a.domain
        else:
            field = {"inputs": "input", "outputs": "output", "attributes": "attribute"}[what]
            la, lb = list(getattr(a, field)), list(getattr(b, field))
            for node, new in ((a, lb), (b, la)):
                del getattr(node, field)[:]
                if field == "attribute":
                    getattr(node, field).extend(new)
                else:
                    getattr(node, field).extend(new)
    elif what.startswith("tensor") and len(tensors) >= 2:
        a, b = (tensors[int(i)] for i in rng.choice(len(tensors), 2, replace=False))
        if what == "tensor dims":
            da, db = list(a.dims), list(b.dims)
            del a.dims[:], b.dims[:]
            a.dims.extend(db)
            b.dims.extend(da)
        elif what == "tensor types":
            a.data_type, b.data_type = b.data_type, a.data_type
        else:
            a.name, b.name = b.name, a.name
    elif what == "io names" and model.graph.input and model.graph.output:
        i, o = model.graph.input[0], model.graph.output[0]
        i.name, o.name = o.name, i.name
    else:
        return f"no two to swap for {what}"
    _store(model, folder)
    return f"swapped {what}"


def dims(rng, folder: Path) -> str:
    model = _load(folder)
    choices = []
    for t in _all_tensors(model):
        choices.append(("tensor", t))
    for vi in _value_infos(model):
        if vi.type.tensor_type.HasField("shape") and vi.type.tensor_type.shape.dim:
            choices.append(("value", vi))
    if not choices:
        return "no dims"
    kind, obj = choices[int(rng.integers(len(choices)))]
    value = HUGE_DIMS[int(rng.integers(len(HUGE_DIMS)))]
    if kind == "tensor":
        if not obj.dims:
            obj.dims.append(value)
        else:
            obj.dims[int(rng.integers(len(obj.dims)))] = value
        name = obj.name
    else:
        shape = obj.type.tensor_type.shape
        d = shape.dim[int(rng.integers(len(shape.dim)))]
        d.Clear()
        d.dim_value = value
        name = obj.name
    _store(model, folder)
    return f"dim {value} in {kind} {name!r}"


def nest(rng, folder: Path) -> str:
    """The main graph's nodes moved into the branches of If nodes nested ``depth`` deep (protobuf
    refuses messages nested past its recursion limit: deep ones are unreadable)."""
    model = _load(folder)
    depth = [1, 3, 20, 60, 200][int(rng.integers(5))]
    g = model.graph
    outputs = [helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type or TensorProto.FLOAT, None)
               for o in g.output]
    inner = helper.make_graph(list(g.node), "level_0", [], outputs, initializer=list(g.initializer))
    # The else branch: the outputs as constants of no elements (the model grows linearly with depth).
    empty = [helper.make_node("Constant", [], [o.name], value=numpy_helper.from_array(np.zeros(0, np.float32)))
             for o in g.output]
    for level in range(1, depth + 1):
        node = helper.make_node("If", ["opbridge_fuzz_cond"], [o.name for o in g.output], then_branch=inner,
                                else_branch=helper.make_graph(empty, f"else_{level}", [], outputs))
        inner = helper.make_graph([node], f"level_{level}", [], outputs)
    del g.node[:]
    g.node.extend(inner.node)
    del g.initializer[:]
    g.initializer.append(numpy_helper.from_array(np.array(True), "opbridge_fuzz_cond"))
    try:
        _store(model, folder)
    except Exception as e:  # protobuf may refuse to serialize it
        return f"nesting {depth} deep not writable: {type(e).__name__}"
    return f"nested {depth} deep in If"


def lying_attributes(rng, folder: Path) -> str:
    model = _load(folder)
    nodes = [n for n in _all_nodes(model) if n.attribute] or _all_nodes(model)
    if not nodes:
        return "no node"
    node = nodes[int(rng.integers(len(nodes)))]
    how = int(rng.integers(5))
    if how == 0 and node.attribute:
        a = node.attribute[int(rng.integers(len(node.attribute)))]
        a.type = int(rng.integers(1, 15))  # the type field lies about the value field set
        return f"attribute {a.name!r} of {node.op_type} claims type {a.type}"
    if how == 1 and node.attribute:
        a = node.attribute[int(rng.integers(len(node.attribute)))]
        name = a.name
        node.attribute.remove(a)
        value = [2.5, "bogus", [1, 2, 3], -1, 2**40, 0, b"\xff\xfe", [0.5, 1.5]][int(rng.integers(8))]
        node.attribute.append(helper.make_attribute(name, value))
        _store(model, folder)
        return f"attribute {name!r} of {node.op_type} set to {value!r}"
    if how == 2 and node.attribute:
        a = node.attribute[int(rng.integers(len(node.attribute)))]
        node.attribute.remove(a)
        _store(model, folder)
        return f"attribute {a.name!r} of {node.op_type} removed"
    if how == 3:
        node.attribute.append(helper.make_attribute(["num_groups", "epsilon", "activation", "axis", "perm",
                                                     "to", "value"][int(rng.integers(7))],
                                                    [0, -3, "silu", 1e30, [9, 9]][int(rng.integers(5))]))
        _store(model, folder)
        return f"attribute added to {node.op_type}"
    a = helper.make_attribute("value", 1)
    a.type = onnx.AttributeProto.TENSOR  # a tensor attribute without its tensor
    node.attribute.append(a)
    _store(model, folder)
    return f"tensor attribute without a tensor on {node.op_type}"


EXTERNAL_FORMS = ["valid", "parent", "absolute", "symlink_out", "symlink_etc", "symlink_in", "missing", "dot",
                  "sub_parent", "offset_text", "offset_negative", "offset_float", "offset_space", "offset_huge",
                  "length_negative", "length_zero", "length_huge", "length_float", "overlap", "duplicate_key",
                  "no_location", "nul", "model_itself", "fifo", "directory", "short_length", "ort_memory"]


def external(rng, folder: Path) -> str:
    """One tensor moved to an external data entry of one of EXTERNAL_FORMS (most are refused)."""
    model = _load(folder)
    candidates = [t for t in _all_tensors(model) if t.data_location != TensorProto.EXTERNAL
                  and t.data_type != TensorProto.STRING]
    if not candidates:
        return "no tensor to move"
    t = candidates[int(rng.integers(len(candidates)))]
    form = EXTERNAL_FORMS[int(rng.integers(len(EXTERNAL_FORMS)))]
    if t.HasField("raw_data"):
        data = bytes(t.raw_data)
    elif 0 <= math.prod(t.dims) <= 1 << 20 and all(d >= 0 for d in t.dims):
        try:
            data = numpy_helper.to_array(t).tobytes()
        except Exception:
            data = b"\x00" * 16
    else:  # dims an earlier mutation made huge: the bytes cannot match them anyway
        data = b"\x00" * 16
    blob = folder / "data.bin"
    with open(blob, "ab") as f:
        offset = f.tell()
        f.write(data)
    entries = {"location": "data.bin", "offset": str(offset), "length": str(len(data))}
    canary = str((folder.parent / CANARY).resolve())
    if form == "parent":
        entries["location"] = f"../{CANARY}"
    elif form == "absolute":
        entries["location"] = canary
    elif form == "symlink_out":
        os.symlink(f"../{CANARY}", folder / "link.bin")
        entries.update(location="link.bin", offset="0")
    elif form == "symlink_etc":
        os.symlink("/etc/passwd", folder / "link.bin")
        entries.update(location="link.bin", offset="0", length="4")
    elif form == "symlink_in":
        os.symlink("data.bin", folder / "link.bin")
        entries["location"] = "link.bin"
    elif form == "missing":
        entries["location"] = "nowhere.bin"
    elif form == "dot":
        entries["location"] = "."
    elif form == "sub_parent":
        entries["location"] = f"sub/../../{CANARY}"
    elif form == "offset_text":
        entries["offset"] = "abc"
    elif form == "offset_negative":
        entries["offset"] = "-1"
    elif form == "offset_float":
        entries["offset"] = "1e3"
    elif form == "offset_space":
        entries["offset"] = f" {offset}"
    elif form == "offset_huge":
        entries["offset"] = str(2**64 + 5)
    elif form == "length_negative":
        entries["length"] = "-4"
    elif form == "length_zero":
        entries["length"] = "0"
    elif form == "length_huge":
        entries["length"] = str(2**63)
    elif form == "length_float":
        entries["length"] = "1e3"
    elif form == "short_length":
        entries["length"] = str(max(0, len(data) - 1))
    elif form == "overlap":
        entries["offset"] = "0"  # may overlap another tensor's bytes: allowed, read twice
    elif form == "no_location":
        del entries["location"]
    elif form == "nul":
        entries["location"] = "data.bin\x00../canary.bin"
    elif form == "model_itself":
        entries.update(location=MODEL, offset="0")
    elif form == "fifo":
        os.mkfifo(folder / "pipe.bin")
        entries.update(location="pipe.bin", offset="0")
    elif form == "ort_memory":  # ONNX Runtime's marker for data at an address, here a real file
        (folder / "*" / "_ORT_MEM_ADDR_").mkdir(parents=True, exist_ok=True)
        (folder / "*" / "_ORT_MEM_ADDR_" / "*").write_bytes(bytes(4096))
        entries.update(location="*/_ORT_MEM_ADDR_/*", offset="16")
    elif form == "directory":
        (folder / "sub").mkdir(exist_ok=True)
        entries.update(location="sub", offset="0")
    t.ClearField("raw_data")
    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        t.ClearField(field)
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    for key, value in entries.items():
        e = t.external_data.add()
        e.key, e.value = key, value
    if form == "duplicate_key":
        e = t.external_data.add()
        e.key, e.value = "location", f"../{CANARY}"
    _store(model, folder)
    return f"tensor {t.name!r} external ({form})"


def garbage(rng, folder: Path) -> str:
    how = int(rng.integers(3))
    if how == 0:
        (folder / MODEL).write_bytes(b"")
        return "empty file"
    if how == 1:
        (folder / MODEL).write_bytes(rng.integers(0, 256, int(rng.integers(1, 4096)), dtype=np.uint8).tobytes())
        return "random bytes"
    (folder / MODEL).write_bytes(numpy_helper.from_array(np.ones((2, 2), np.float32), "t").SerializeToString())
    return "a TensorProto, not a ModelProto"


MUTATIONS = {"truncate": truncate, "flip_bytes": flip_bytes, "swap_fields": swap_fields, "dims": dims, "nest": nest,
             "lying_attributes": lying_attributes, "external": external, "garbage": garbage}
# Proto-level mutations more often than byte-level ones, which protobuf mostly refuses at once.
WEIGHTS = {"truncate": 1, "flip_bytes": 2, "swap_fields": 3, "dims": 3, "nest": 1, "lying_attributes": 3,
           "external": 4, "garbage": 0.5}


# --------------------------------------------------------------------------------------------
# Running a case
# --------------------------------------------------------------------------------------------


class Canary:
    """Reports whether a file was opened or read (inotify), or None where inotify is unavailable."""

    IN_ACCESS, IN_OPEN = 0x1, 0x20

    def __init__(self, path: Path) -> None:
        self.fd = -1
        name = ctypes.util.find_library("c")
        if not name or not sys.platform.startswith("linux"):
            return
        libc = ctypes.CDLL(name, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd >= 0 and libc.inotify_add_watch(self.fd, str(path).encode(), self.IN_ACCESS | self.IN_OPEN) < 0:
            os.close(self.fd)
            self.fd = -1

    def touched(self) -> bool | None:
        if self.fd < 0:
            return None
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return False
        touched = False
        while data:
            mask = struct.unpack_from("iIII", data)[1]
            length = struct.unpack_from("iIII", data)[3]
            touched |= bool(mask & (self.IN_ACCESS | self.IN_OPEN))
            data = data[16 + length:]
        return touched

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


def _snapshot(case: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(case):
        rel = os.path.relpath(dirpath, case)
        if rel == "out" or rel.startswith("out" + os.sep):
            continue
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if rel == "." and name == "out":
                continue
            st = os.lstat(p)
            out[os.path.relpath(p, case)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def _child(case: Path, argv: list[str], target=None) -> None:
    """Runs in the forked process (``opbridge argv``, or ``target()`` for the judge's own tests);
    never returns."""
    code = 70
    try:
        faulthandler.disable()  # a crash is judged from the exit signal; pytest's handler would print it too
        os.chdir(case)
        fd = os.open("stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(os.open("stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        os.environ["TMPDIR"] = str(case / "tmp")
        tempfile.tempdir = str(case / "tmp")
        data = _status("VmData")
        resource.setrlimit(resource.RLIMIT_DATA, (data + MEMORY_LIMIT, data + MEMORY_LIMIT))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
        if target is not None:
            code = target()
        else:
            import opbridge.cli

            code = opbridge.cli.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # what Python would print for an uncaught exception
        traceback.print_exc()
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 70)


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def run_case(case: Path, argv: list[str], timeout_s: float = TIMEOUT_S, target=None) -> dict:
    """Forks, runs ``opbridge argv`` (or ``target()``) in ``case`` and judges it (module docstring)."""
    before = _snapshot(case)
    canary = Canary(case / CANARY)
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        _child(case, argv, target)
    status = None
    while time.perf_counter() - start < timeout_s:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.005)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        status = None
    wall = time.perf_counter() - start
    touched = canary.touched()
    canary.close()
    out = (case / "stdout").read_text(errors="replace") if (case / "stdout").exists() else ""
    err = (case / "stderr").read_text(errors="replace") if (case / "stderr").exists() else ""
    for name in ("stdout", "stderr"):
        if (case / name).exists():
            (case / name).unlink()
    after = _snapshot(case)
    findings = []
    code = None
    if status is None:
        findings.append(f"hang: still running after {timeout_s:.0f} s")
    elif os.WIFSIGNALED(status):
        findings.append(f"crash: {signal.Signals(os.WTERMSIG(status)).name}")
    else:
        code = os.WEXITSTATUS(status)
        if code not in (0, 1, 2):
            findings.append(f"exit status {code}")
    if "Traceback (most recent call last)" in out + err:
        findings.append("Python traceback")
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)
                     and k not in ("stdout", "stderr", "tmp") + ORT_OWN_FILES)
    if changed:
        findings.append(f"files written outside out/: {changed[:5]}")
    if touched:
        findings.append("the canary beside the input's folder was opened")
    outputs = sorted(os.listdir(case / "out")) if (case / "out").exists() else []
    if code not in (None, 0) and outputs:
        findings.append(f"a failed run left {outputs} in out/")
    # The command's own line first: ONNX Runtime logs its warnings to stderr too.
    lines = [line for line in err.splitlines() if line.strip()]
    message = next((line for line in lines if line.startswith("opbridge ")), lines[0] if lines else "")
    if code == 0 or (code == 1 and not message.startswith("opbridge ")):
        failed = [line.strip() for line in out.splitlines() if line.lstrip().startswith("FAILED")]
        message = failed[0] if failed else next((line for line in reversed(out.splitlines()) if line.strip()),
                                                message)
    return {"argv": argv[0], "exit": code, "message": message.replace(str(case), "<case>")[:MESSAGE_CHARS],
            "findings": findings, "wall_s": round(wall, 3), "canary_watched": touched is not None,
            "log": (out + err)[-4000:] if findings else ""}


def make_case(root: Path, index: int, seeds: list[Path], seed: int) -> tuple[Path, list[str], str]:
    """The case's folder (in/, out/, tmp/ and the canary), the command and what was done to it."""
    rng = np.random.default_rng([seed, index])
    case = root / f"case_{index:05d}"
    source = seeds[int(rng.integers(len(seeds)))]
    shutil.copytree(source, case / "in", symlinks=True)
    (case / "tmp").mkdir()
    (case / CANARY).write_bytes(b"canary " * 64)
    names = list(MUTATIONS)
    p = np.array([WEIGHTS[n] for n in names], float)
    done = []
    for _ in range(int(rng.integers(1, 4))):
        name = names[int(rng.choice(len(names), p=p / p.sum()))]
        try:
            done.append(f"{name}: {MUTATIONS[name](rng, case / 'in')}")
        except Exception as e:  # a mutation that cannot apply to what an earlier one left
            done.append(f"{name}: not applicable ({type(e).__name__})")
    return case, f"{source.name}; " + "; ".join(done)


def argv_of(command: str) -> list[str]:
    return [command, f"in/{MODEL}"] + (["out/model.onnx"] if command == "optimize" else [])


# Refusals only optimize makes: a model it cannot hold in memory, an output it cannot write.
OPTIMIZE_ONLY = (" of memory to optimize", "cannot write ")
# A run's message is recorded to this many characters, the command's name included.
MESSAGE_CHARS = 300


def verdict_disagreement(check: dict, optimize: dict) -> str:
    """Where ``check`` and ``optimize`` (run results of one case) disagree about the file: a file
    the reader refuses is refused by both (exit status 2) with the same message; optimize refuses
    more only for what it does beyond check (OPTIMIZE_ONLY) or a model ONNX Runtime cannot run
    (check's 1). Empty when they agree."""
    if check["exit"] is None or optimize["exit"] is None:
        return ""  # a hang is a finding of its own
    why_c = check["message"].removeprefix("opbridge check: ")
    why_o = optimize["message"].removeprefix("opbridge optimize: ")
    # A message cut at MESSAGE_CHARS keeps fewer characters of the reason after optimize's longer
    # name: cut ones are compared as far as both go.
    cut = max(len(check["message"]), len(optimize["message"])) >= MESSAGE_CHARS
    n = min(len(why_c), len(why_o)) if cut else None
    if check["exit"] == 2 and (optimize["exit"] != 2 or why_c[:n] != why_o[:n]):
        return f"check refused ({why_c!r}), optimize exited {optimize['exit']} ({why_o!r})"
    if optimize["exit"] == 2 and check["exit"] != 2 and not any(k in why_o for k in OPTIMIZE_ONLY):
        return f"optimize refused ({why_o!r}), check exited {check['exit']} ({why_c!r})"
    if "its graph is malformed" in why_o and check["exit"] == 0:
        return f"optimize found the graph malformed ({why_o!r}), check ran it"
    return ""


def fuzz(cases: int, seed: int, work: Path, record=None, keep: bool = False, out=sys.stderr) -> list[dict]:
    """Runs ``cases`` cases; returns the findings (each a case's result with its description)."""
    # What the imports below write to the temporary folder (ONNX Runtime takes it when imported)
    # goes to the run's own, not the machine's.
    (work / "tmp").mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(work / "tmp")
    tempfile.tempdir = None
    import opbridge._check  # noqa: F401  (imported before forking: a case costs a fork)
    import opbridge._optimize  # noqa: F401
    import opbridge.cli  # noqa: F401
    import opbridge.onnx  # noqa: F401
    import onnxruntime  # noqa: F401
    import onnxscript.rewriter.pattern  # noqa: F401

    seeds = seed_models(work / "seeds")
    findings = []
    verdicts: dict[str, int] = {}
    start = time.perf_counter()
    for i in range(cases):
        t0 = time.perf_counter()
        case, desc = make_case(work, i, seeds, seed)
        result = {"case": i, "mutations": desc, "make_s": round(time.perf_counter() - t0, 3)}
        for command in COMMANDS:
            result[command] = run_case(case, argv_of(command))
        disagreement = verdict_disagreement(result["check"], result["optimize"])
        result["findings"] = [f"{c}: {f}" for c in COMMANDS for f in result[c]["findings"]] + (
            [f"verdicts differ: {disagreement}"] if disagreement else [])
        verdict = "finding" if result["findings"] else f"check {result['check']['exit']} optimize " \
                                                        f"{result['optimize']['exit']}"
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
        if record is not None:
            record.write(json.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "log"} if k in COMMANDS else v)
                                     for k, v in result.items()}) + "\n")
        if result["findings"]:
            findings.append(result)
            logs = "\n".join(result[c]["log"] for c in COMMANDS if result[c]["log"])
            print(f"case {i} ({desc}): {result['findings']}\n{logs}", file=out, flush=True)
        if not keep:
            shutil.rmtree(case, ignore_errors=True)
    print(f"{cases} cases (seed {seed}), each run by {' and '.join(COMMANDS)}, in {time.perf_counter() - start:.0f} s "
          f"over {len(seeds)} seed models: {dict(sorted(verdicts.items()))}", file=out, flush=True)
    return findings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    p.add_argument("--record", default=None, help="write every case's outcome as a JSON line here")
    p.add_argument("--keep", default=None, help="work in this folder and keep every case's files")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"model-file fuzzing: seed {seed} (replay with --seed {seed})", file=sys.stderr, flush=True)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="opbridge-fuzz-files-"))
    work.mkdir(parents=True, exist_ok=True)
    record = open(args.record, "w") if args.record else None
    try:
        findings = fuzz(args.cases, seed, work, record=record, keep=bool(args.keep))
    finally:
        if record is not None:
            record.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"seed": seed, "cases": args.cases, "findings": len(findings)}))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
