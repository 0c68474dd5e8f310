"""Fuzz worker: a child process that runs cases sent by tests/fuzz/harness.py.

Protocol on stdin/stdout: 8-byte little-endian length + pickle, one request, one reply. A request
is a payload dict with "kind" ("init", "ort" or "torch"); the reply is ("ok", outputs) or
("error", exception type name, message). If a case crashes the process or hangs it, the parent
notices (EOF / timeout), records the case and starts a new worker.

Runs as a script (python worker.py): imports only numpy at start, onnxruntime and torch lazily.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys

# Run as a script, this file's folder is sys.path[0]; it holds a package named `ops` that must not
# shadow anything the ops under test import.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import numpy as np  # noqa: E402

_HEADER = struct.Struct("<Q")


def _read_exact(f, n):
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


# ---------------------------------------------------------------------------- ORT
_ort = None
_lib = None


def _ort_init():
    global _ort, _lib
    if _ort is None:
        import onnxruntime

        import opbridge

        if _lsan() is not None:
            _lsan().pin_library()

        # ORT logs every failed node at ERROR level; the parent judges the status instead.
        onnxruntime.set_default_logger_severity(4)
        _ort, _lib = onnxruntime, opbridge.get_library_path()
    return _ort


def run_ort(p):
    """p: model (bytes), feeds {name: array}, threads (int or None), register (how many times
    to register the library on the session options; default 1)."""
    ort = _ort_init()
    so = ort.SessionOptions()
    if p.get("threads"):
        so.intra_op_num_threads = p["threads"]
    for _ in range(p.get("register", 1)):
        so.register_custom_ops_library(_lib)
    providers = ["CPUExecutionProvider"]
    if os.environ.get("OPBRIDGE_FUZZ_DEVICE", "cpu") == "cuda":
        # ORT's CUDA provider with no CPU fallback: every node runs our CUDA kernel (or the session
        # fails), against the same expectations and error messages as the CPU provider.
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        providers = ["CUDAExecutionProvider"]
    sess = ort.InferenceSession(p["model"], sess_options=so, providers=providers)
    return [np.asarray(o) for o in sess.run(None, p["feeds"])]


# ---------------------------------------------------------------------------- torch
_torch = None


def _torch_init():
    global _torch
    if _torch is None:
        import torch

        import opbridge.ops  # noqa: F401  (loads the extension: torch.ops.opbridge.*)

        _torch = torch
    return _torch


_DTYPES = {}


def _dtype(name):
    torch = _torch_init()
    if not _DTYPES:
        _DTYPES.update({n: getattr(torch, n) for n in (
            "float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool",
            "complex64", "complex128")})
    return _DTYPES[name]


def make_tensor(spec):
    """A torch tensor whose values are spec["data"] (any numpy array, in the logical shape), with
    the memory layout spec["layout"] asks for:
      "contiguous" | ("permute", perm) | "channels_last" | ("slice", dim, step) | ("expand", dim)
    plus dtype, device ("cpu" or "meta") and requires_grad."""
    torch = _torch_init()
    data = spec["data"]
    dt = _dtype(spec["dtype"])
    layout = spec.get("layout", "contiguous")
    kind = layout if isinstance(layout, str) else layout[0]

    def base(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(dt)

    if kind == "empty":
        # An empty tensor whose other dims may be far too large for numpy ([2^62, 1, 0]).
        t = torch.empty(spec["empty_shape"], dtype=dt)
    elif kind == "contiguous":
        t = base(data)
    elif kind == "permute":
        perm = list(layout[1])
        inv = np.argsort(perm).tolist()
        t = base(np.transpose(data, perm)).permute(*inv)
    elif kind == "channels_last":
        fmt = torch.channels_last if data.ndim == 4 else torch.channels_last_3d
        t = base(data).contiguous(memory_format=fmt)
    elif kind == "slice":
        dim, step = layout[1], layout[2]
        shape = list(data.shape)
        shape[dim] *= step
        big = np.zeros(shape, dtype=data.dtype) if data.dtype != object else np.empty(shape, object)
        idx = [slice(None)] * data.ndim
        idx[dim] = slice(None, None, step)
        big[tuple(idx)] = data
        t = base(big)[tuple(idx)]
    elif kind == "expand":
        dim = layout[1]
        t = base(np.take(data, [0], axis=dim)).expand(*data.shape)
    else:
        raise ValueError(f"unknown layout {layout!r}")
    device = spec.get("device", "cpu")
    if device == "cpu":
        # OPBRIDGE_FUZZ_DEVICE=cuda: every case's CPU tensors on the GPU instead (the same
        # expectations: the CUDA kernels must give the CPU op's verdicts and results).
        device = os.environ.get("OPBRIDGE_FUZZ_DEVICE", "cpu")
    if device != "cpu":
        t = t.to(device)
    if spec.get("requires_grad"):
        t.requires_grad_(True)
    return t


def _to_numpy(t):
    torch = _torch_init()
    if t.device.type == "meta" or t.numel() == 0:
        kind = "meta" if t.device.type == "meta" else "empty"
        return (kind, tuple(t.shape), str(t.dtype).replace("torch.", ""))
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().copy(), "bfloat16"
    return t.numpy().copy(), str(t.dtype).replace("torch.", "")


def run_torch(p):
    """p: op (name in torch.ops.opbridge), args (list of tensor specs / None / python values,
    tensor specs are dicts with "data"), grad (tensor spec of dy, or None: no backward).
    Returns [y, (dx, dweight, dbias) for the tensor args that require grad], each as
    (numpy array, dtype name) or ("meta", shape, dtype)."""
    torch = _torch_init()
    # The C++ kernels' errors cross the stable ABI as RuntimeError tagged with their type; they are
    # judged as the Python API raises them (opbridge.ops: the tagged type; an untagged RuntimeError
    # stays one and fails an invalid case's check).
    from opbridge.ops._errors import raise_translated

    args = [make_tensor(a) if isinstance(a, dict) and "data" in a else a for a in p["args"]]
    op = getattr(torch.ops.opbridge, p["op"]).default
    try:
        y = op(*args)
        rest = []
        if isinstance(y, (tuple, list)):
            # An op with several outputs (three_nn: dist, indices): the others follow the first
            # where gradients go (no such op is differentiable).
            y, rest = y[0], [_to_numpy(t) for t in y[1:]]
        outs = [_to_numpy(y), {"contiguous": bool(y.is_contiguous()), "shape": tuple(y.shape)}]
        if rest:
            outs.append(rest)
        if p.get("grad") is not None:
            dy = make_tensor(p["grad"])
            inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            grads = torch.autograd.grad(y, inputs, dy, allow_unused=True)
            outs.append([None if g is None else _to_numpy(g) for g in grads])
    except RuntimeError as e:
        raise_translated(e)
        raise
    return outs


# ---------------------------------------------------------------------------- main loop
def _selftest(p):
    """What the harness's own tests use to check that crashes and hangs are caught."""
    action = p["action"]
    if action == "abort":
        os.abort()
    if action == "segfault":
        import ctypes

        ctypes.string_at(0)
    if action == "exit":
        os._exit(3)
    if action == "hang":
        import time

        time.sleep(3600)
    raise ValueError(f"selftest: {action}")


def _init(p):
    for m in p.get("modules", ()):
        {"ort": _ort_init, "torch": _torch_init}[m]()
    return os.getpid()


HANDLERS = {"init": _init, "ort": run_ort, "torch": run_torch, "selftest": _selftest}


def _lsan():
    """tests/helpers/lsan.py under scripts/sanitize.sh (LeakSanitizer on), else None."""
    if not os.environ.get("OPBRIDGE_LSAN_DIR"):
        return None
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from helpers import lsan

    return lsan


def _leak_check():
    """LeakSanitizer's report of opbridge's leaks, taken when the parent closes the worker (the
    pytest process collects it)."""
    lsan = _lsan()
    if lsan is not None:
        lsan.check("fuzz worker")


def main():
    # The protocol owns the original stdout; anything a library prints goes to stderr.
    proto = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    limit = os.environ.get("OPBRIDGE_FUZZ_RLIMIT_AS")
    if limit:
        # A case must never allocate gigabytes: cap the address space so one that tries fails
        # instead of swapping a shared machine (off under ASan, which reserves terabytes).
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))
    stdin = sys.stdin.buffer
    while True:
        head = _read_exact(stdin, _HEADER.size)
        if head is None:
            _leak_check()
            return
        payload = pickle.loads(_read_exact(stdin, _HEADER.unpack(head)[0]))
        try:
            reply = ("ok", HANDLERS[payload["kind"]](payload))
        except Exception as e:  # noqa: BLE001 - every exception is an outcome to judge
            reply = ("error", type(e).__name__, str(e))
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        proto.write(_HEADER.pack(len(data)) + data)
        proto.flush()


if __name__ == "__main__":
    main()
