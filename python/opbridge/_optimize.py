"""``opbridge optimize IN.onnx OUT.onnx``: GroupNorm in models exported by anyone, as one
``ai.opbridge::GroupNorm`` node (with SiLU fused where it follows).

Rewritten (docs/optimize.md has the exact conditions of each rule):

* the GroupNorm decomposition of torch's exporters (TorchScript, and dynamo below opset 21):
  Reshape(X, [0, G, -1]) -> InstanceNormalization(ones, zeros) -> Reshape(Shape(X)) -> Mul -> Add;
* ``GroupNormalization``-18 (per-group scale and bias, converted to per-channel ones) and -21;
* ``com.microsoft::GroupNorm`` (NHWC by default, with an ``activation``): channels-last inputs get
  Transposes around our node, and a Transpose pair that cancels out is dropped;
* then GroupNorm followed by SiLU (``Mul(y, Sigmoid(y))``, ``Swish(alpha=1)``,
  ``com.microsoft::QuickGelu(alpha=1)``, ``y / (1 + Exp(-y))``) becomes ``GroupNorm(activation="silu")``
  when nothing else reads the GroupNorm's output.

Every rule is an onnxscript pattern-rewriter rule (onnxscript.rewriter.pattern): the matcher
guarantees that the replaced nodes' intermediate values have no reader outside the pattern.

The command checks the rewritten model against the original on random inputs in ONNX Runtime
and writes nothing when they disagree. Needs onnx, onnxscript and onnxruntime; not torch.

The rules themselves are opbridge.onnx's (onnx/_rewrite.py, which export(fuse=True) also runs);
this module is the command around them: files, memory, the check against the original.
"""

from __future__ import annotations

import dataclasses
import errno
import gc
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Iterator, Mapping, Sequence, TextIO

import numpy as np

from . import _memory
from ._library import DOMAIN, MS_DOMAIN
from ._ort import import_onnxruntime
from .onnx import _reader

from .onnx._declared_export import model_problems
from .onnx._external_data import (AUTO_EXTERNAL_BYTES, EXTERNAL_ALIGNMENT, EXTERNAL_THRESHOLD, WriteError,
                                   data_file_name, tensor_bytes, writing)
from .onnx._rewrite import RewriteResult, rewrite_model


# Agreement required between the rewritten and the original model, per output:
#   max |rewritten - original| <= tol * max(1, max |original|)
# GroupNorm is reassociated (statistics in another order, scale and bias folded), so the outputs
# differ by rounding; a normalized max error keeps the test meaningful for outputs of any scale.
log = logging.getLogger(__name__)  # stage timings at the command's -v

TOLERANCE = {"float64": 1e-3, "float32": 1e-3, "float16": 2e-2, "bfloat16": 5e-2}
DEFAULT_RUNS = 2



# --------------------------------------------------------------------------------------------
# References and comparison
# --------------------------------------------------------------------------------------------


def ms_group_norm_reference(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, *, groups: int, epsilon: float = 1e-5,
                            activation: int = 0, channels_last: int = 1) -> np.ndarray:
    """com.microsoft::GroupNorm as ONNX Runtime documents it, in float64 (result in X's dtype):
    y = gamma * (x - mean) / sqrt(var + epsilon) + beta per group of C / groups channels, X NHWC
    when channels_last = 1 (else NCHW), then SiLU when activation = 1."""
    x64 = np.asarray(x, dtype=np.float64)
    if channels_last:
        x64 = np.moveaxis(x64, -1, 1)
    n, c = x64.shape[:2]
    g = x64.reshape(n, groups, -1)
    mean = g.mean(axis=2, keepdims=True)
    var = ((g - mean) ** 2).mean(axis=2, keepdims=True)
    y = ((g - mean) / np.sqrt(var + epsilon)).reshape(x64.shape)
    bshape = (1, c) + (1,) * (x64.ndim - 2)
    y = y * np.asarray(gamma, np.float64).reshape(bshape) + np.asarray(beta, np.float64).reshape(bshape)
    if activation == 1:
        y = y / (1.0 + np.exp(-y))
    if channels_last:
        y = np.moveaxis(y, 1, -1)
    return y.astype(np.asarray(x).dtype)


def _reference_outputs(path: str, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
    """Runs the model at ``path`` with onnx's reference evaluator, com.microsoft::GroupNorm from
    ms_group_norm_reference (ONNX Runtime has no CPU kernel for it)."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun

    class GroupNorm(OpRun):
        op_domain = MS_DOMAIN
        # Without this, OpRun looks schemas up by op name across domains and may find
        # ai.opbridge::GroupNorm's (registered with onnx by opbridge.onnx).
        op_schema = None

        def _run(self, X, gamma, beta, activation=None, channels_last=None, epsilon=None, groups=None):
            return (ms_group_norm_reference(X, gamma, beta, groups=int(groups),
                                            epsilon=1e-5 if epsilon is None else float(epsilon),
                                            activation=int(activation or 0),
                                            channels_last=1 if channels_last is None else int(channels_last)),)

    evaluator = ReferenceEvaluator(_reader.load_with_data(path), new_ops=[GroupNorm])
    return [np.asarray(v) for v in evaluator.run(list(names), dict(feeds))]


def tolerance_for(dtype: Any) -> float | None:
    """The normalized max-error tolerance for outputs of this numpy dtype (None: must be equal)."""
    return TOLERANCE.get(np.dtype(dtype).name)


def compare(got: np.ndarray, ref: np.ndarray, tol: float | None) -> tuple[float, str]:
    """How far ``got`` is from ``ref``: (error / allowed error, one-line summary). A ratio <= 1
    agrees (see TOLERANCE); inf when shapes, non-finite values or exact (integer) values differ."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return math.inf, f"shape {list(got.shape)} instead of {list(ref.shape)}"
    if tol is None or not np.issubdtype(ref.dtype, np.floating):
        bad = int(np.count_nonzero(got != ref))
        return (0.0, "equal") if bad == 0 else (math.inf, f"{bad} elements differ")
    g, r = got.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(r)
    # Non-finite reference values must be reproduced exactly (inf sign, NaN); NaN == NaN here.
    same_nonfinite = np.all((np.isnan(g) & np.isnan(r)) | (g == r) | finite)
    if not same_nonfinite or not np.all(np.isfinite(g[finite])):
        return math.inf, "non-finite values differ"
    if not finite.any():
        return 0.0, "max error 0"
    err = float(np.max(np.abs(g[finite] - r[finite])))
    limit = tol * max(1.0, float(np.max(np.abs(r[finite]))))
    return err / limit, f"max error {err:.3g} (allowed {limit:.3g})"


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


# The input cannot be read as an ONNX model (the file, and for a tensor which and why): the one
# reader's (onnx/_reader.py), which `opbridge check` and opbridge.InferenceSession share.
UnreadableModel = _reader.UnreadableModel


def load(path: str) -> Any:
    """The model at ``path`` as an onnx_ir Model, every tensor checked (onnx/_reader.py); external
    data stays on disk (memory-mapped from the checked files)."""
    return _reader.load(path)


@dataclasses.dataclass
class ModelFiles:
    """What a model's files hold, read from the graph alone (no tensor is loaded)."""

    path: str
    file_bytes: int  # the model file itself
    inline_bytes: int  # tensor bytes stored in the model file
    external_bytes: int  # tensor bytes stored in external data files
    data_files: list[str]

    @property
    def tensor_bytes(self) -> int:
        return self.inline_bytes + self.external_bytes

    @property
    def external(self) -> bool:
        return bool(self.data_files)


def model_files(path: str) -> ModelFiles:
    """Reads the graph of the model at ``path`` (not its external data) and checks every tensor
    (onnx/_reader.py: external data inside the model's folder, offsets and lengths within its
    files). UnreadableModel naming the file, the tensor and the reason otherwise."""
    path = os.fspath(path)
    proto = _reader.read_graph(path)
    external = _reader.check(proto, path)
    file_bytes = os.path.getsize(path)
    # Stored inline: what the file holds beyond the graph, which the tensors dwarf when it matters.
    inline = sum(t.ByteSize() for t in _inline_tensors(proto))
    return ModelFiles(path=path, file_bytes=file_bytes, inline_bytes=inline,
                      external_bytes=sum(data.length for _, data in external),
                      data_files=sorted({data.file for _, data in external}))


def _inline_tensors(proto: Any) -> Iterator[Any]:
    import onnx

    from .onnx._external_data import _tensors

    return (t for t in _tensors(proto.graph) if t.data_location != onnx.TensorProto.EXTERNAL)


def uses_external_data(model: Any) -> bool:
    import onnx_ir as ir

    for graph in (model.graph, *model.graph.subgraphs()):
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                return True
    return False






def save(model: Any, path: str, external: bool) -> None:
    """Writes ``model`` to ``path``; with ``external``, tensors > 1 KiB go to data_file_name(path)
    in the same folder (large ones 64 KiB-aligned so that ONNX Runtime can memory-map them),
    written one tensor at a time from where they are (the input's data file, memory-mapped)."""
    import onnx_ir as ir

    path = os.fspath(path)
    if external:
        ir.save(model, path, external_data=data_file_name(path), size_threshold_bytes=EXTERNAL_THRESHOLD,
                alignment=EXTERNAL_ALIGNMENT)
    else:
        ir.save(model, path)


# --------------------------------------------------------------------------------------------
# Memory: what optimize needs, known before loading the model
# --------------------------------------------------------------------------------------------

# Peak RSS of `opbridge optimize`, measured in child processes (ru_maxrss) on float32 models of
# 0.5-4 GB (docs/optimize.md, "Memory and time"); G = the model's tensor bytes:
# * the interpreter with numpy, onnx, onnx_ir, onnxscript and onnxruntime: about 0.2 GB (BASE_BYTES
#   leaves room);
# * an input with its tensors in the model file is read whole: the file's bytes and the parsed
#   model, 2 G for a moment; one with external data is memory-mapped (pages read when used);
# * writing: external data is copied one tensor at a time; one file (at most AUTO_EXTERNAL_BYTES)
#   is serialized (a copy of the model, then its bytes) while the input is still held;
# * the check runs the original, then the rewritten model in ONNX Runtime, one session at a time:
#   about G over external data (the mapped weights), 2 G over a model file with its tensors inline
#   (the file's bytes and the weights). Each factor below is the measured one rounded up by 10%.
BASE_BYTES = 300 << 20
SESSION_FACTOR_EXTERNAL = 1.1
INLINE_FACTOR = 2.2
# Reading a model file of this size or less to learn its tensor sizes costs nothing worth
# counting; a larger file is mostly tensors, and its size is their size.
GRAPH_ONLY_BYTES = 64 << 20


def estimated_peak(tensor_bytes: int, inline_input: bool, external_output: bool) -> int:
    """Peak RSS optimize needs for a model of ``tensor_bytes`` (see above)."""
    g = tensor_bytes
    if not inline_input:
        stages = [SESSION_FACTOR_EXTERNAL * g, 0 if external_output else INLINE_FACTOR * g]
    else:
        stages = [INLINE_FACTOR * g, g + (0 if external_output else INLINE_FACTOR * g)]
    return BASE_BYTES + int(max(stages))


def available_memory() -> int | None:
    """The memory this process may still take (bytes): MemAvailable, the cgroup's limit, or
    OPBRIDGE_MEMORY_LIMIT when set (opbridge/_memory.py); None where nothing says."""
    return _memory.available()[0]


parse_size = _memory.parse_size


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def preflight(input_path: str, output_path: str, max_memory: int | None) -> None:
    """Refuses (UnreadableModel / MemoryError / WriteError) what optimize cannot do, before the
    tensors are read: a file that is not an ONNX model or whose external data is missing or
    truncated, a model whose estimated peak exceeds ``max_memory``, an output folder without room
    for the output. A model file too large to read just for its sizes is judged by its size (and
    checked again once loaded)."""
    size = os.path.getsize(input_path)
    if size <= GRAPH_ONLY_BYTES:
        files = model_files(input_path)
        g, external_input, out_bytes = files.tensor_bytes, files.external, files.tensor_bytes + files.file_bytes
    else:
        g, external_input, out_bytes = size, False, size
    check_memory(input_path, g, external_input, max_memory)
    _check_disk(out_bytes, output_path)


def check_memory(path: str, tensor_bytes: int, external_input: bool, max_memory: int | None) -> None:
    """MemoryError when optimize's estimated peak for this model exceeds ``max_memory``."""
    if max_memory is None:
        return
    need = estimated_peak(tensor_bytes, inline_input=not external_input,
                          external_output=external_input or tensor_bytes > AUTO_EXTERNAL_BYTES)
    if need > max_memory:
        raise MemoryError(_too_large(path, tensor_bytes, need, max_memory))


def _too_large(path: str, tensor_bytes: int, need: int, max_memory: int) -> str:
    return (f"{path}: a model of {_gb(tensor_bytes)} of tensors needs about {_gb(need)} of memory to optimize "
            f"and check, more than the {_gb(max_memory)} allowed (--max-memory; by default the memory available "
            f"now: MemAvailable or the cgroup's limit, or {_memory.ENV}); nothing was read or written")


def _check_disk(out_bytes: int, output_path: str) -> None:
    folder = os.path.dirname(os.path.abspath(output_path))
    probe = folder
    while not os.path.isdir(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return
    if free < out_bytes:
        raise WriteError(errno.ENOSPC, f"cannot write {output_path}: about {_gb(out_bytes)} needed, "
                                       f"{_gb(free)} free in {probe}")


# --------------------------------------------------------------------------------------------
# optimize: rewrite, check, write
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Report:
    result: RewriteResult | None = None
    checked: list[str] = dataclasses.field(default_factory=list)
    error: str = ""
    written: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.error


def _session(path: str, providers: Sequence[str]) -> Any:
    ort = import_onnxruntime()

    from ._session import InferenceSession

    so = ort.SessionOptions()
    # Extended, not all, graph optimizations: at the "all" level ONNX Runtime's CPU layout
    # transform copies every Conv weight into a blocked layout while it loads the model, 4 G of
    # peak RSS for a model of G bytes of Conv weights instead of 1.1 G (docs/optimize.md, "Memory
    # and time"). Both models are checked at the same level; the layout changes no result.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    # Without prepacking, ORT reads the weights of a model with external data straight from the
    # memory-mapped data file (page cache the kernel can reclaim) instead of copying each
    # MatMul/Conv weight into a packed buffer of its own; measured: the same peak RSS and time
    # for the check (docs/optimize.md, "Memory and time"). The rewrite changes no such op.
    so.add_session_config_entry("session.disable_prepacking", "1")
    # Without the arena, what a run computes is returned to the system when the run ends, instead
    # of staying in the arena (rounded up) next to the next session's: a model whose run computes
    # a tensor as large as its weights ((c * 2)[:4] of a constant c) needed 3 G in the check with
    # it, 2 G without. The check runs a few times; the arena's speed does not matter.
    so.enable_cpu_mem_arena = False
    # Constant folding would load an initializer that a constant subgraph reads (Slice(p) of a
    # 1-D parameter) into memory next to its mapping, and fold it: 2 G for a model of G bytes.
    # The check runs the same subgraph on every run instead (it reads what it needs).
    return InferenceSession(path, so, providers=providers, disabled_optimizers=["ConstantFolding"])


def _missing_ops(path: str, providers: Sequence[str]) -> list[str]:
    """Ops of the model at ``path`` that nothing here runs (see opbridge check)."""
    from ._check import classify

    proto = _reader.read_graph(path)
    return [u.name for u in classify(proto, providers) if not u.provider]


def _session_with_float32_grid_samples(original: str, rewritten: str, providers: Sequence[str]) -> Any:
    """A session of the original with each GridSample ORT has no kernel for (a float16 image, or the
    TorchScript exporter's float64 grid for a float32 image) computed in float32, as torch computed
    it (onnx/_msda_rules.py); None when that is not what kept ORT from loading it."""
    from .onnx._msda_rules import runnable_original

    patched = runnable_original(original, os.path.dirname(os.path.abspath(rewritten)))
    try:
        return None if patched is None else _session(patched, providers)
    except Exception:  # still not loadable: the caller reports the original's error
        return None


# A full garbage collection between optimize's steps frees a large model's tensors that reference
# cycles hold (the graph's, ORT's session objects), so that no two steps hold them at once. Below
# this many bytes of tensors there is nothing worth freeing early, and a collection costs the whole
# process's heap: 0.25 s each in a process that has imported torch and transformers, ~1 s in a long
# test session, four per call.
COLLECT_BYTES = 32 << 20


def _release(nbytes: int) -> None:
    """gc.collect() where the model's tensors (nbytes) are large enough to matter."""
    if nbytes >= COLLECT_BYTES:
        gc.collect()


def check_against(original: str, rewritten: str, *, providers: Sequence[str], dims: Mapping[str, int],
                  runs: int, tol: float | None, out: TextIO, seed: int = 0, nbytes: int = COLLECT_BYTES) -> str:
    """Runs both models on the same random inputs and compares every output. Returns "" when they
    agree, else what went wrong (also printed).

    One ONNX Runtime session at a time: the original runs on every input first and its outputs
    are kept; its session is released before the rewritten model's is made, so that the weights
    are never held twice (nbytes: the models' tensor bytes, see COLLECT_BYTES)."""
    ort = import_onnxruntime()

    from ._check import random_inputs

    missing = _missing_ops(original, providers)
    use_reference = False
    if missing:
        if set(missing) <= {f"{MS_DOMAIN}::GroupNorm"}:
            use_reference = True
        else:
            return (f"cannot check the rewrite: the original model uses {', '.join(missing)}, which nothing "
                    f"here runs ({', '.join(providers)}); nothing was written")

    def make_feeds(session: Any) -> list[dict[str, np.ndarray]]:
        return [random_inputs(session, dims, seed=seed + run) for run in range(runs)]

    ran_as = ""
    refs: list[list[np.ndarray]] = []
    names: list[str] = []
    feeds: list[dict[str, np.ndarray]] = []
    if not use_reference:
        # The original first: where it cannot be loaded either (a bfloat16 Conv has no CPU kernel),
        # the rewrite is not what failed.
        try:
            session = _session(original, providers)
        except Exception as e:  # ORT raises its own exception types
            session = _session_with_float32_grid_samples(original, rewritten, providers)
            if session is None:
                return (f"onnxruntime {ort.__version__} cannot load the original model with {', '.join(providers)}, "
                        f"so the rewrite cannot be checked (--provider selects another execution provider): {e}")
            ran_as = ", its GridSample nodes of types ORT lacks computed in float32"
        names = [o.name for o in session.get_outputs()]
        try:
            feeds = make_feeds(session)
        except ValueError as e:
            return f"cannot check the rewrite: {e}"
        try:
            refs = [session.run(names, f) for f in feeds]
        except Exception as e:
            return f"running the original model failed: {e}"
        session = None
        _release(nbytes)  # ORT's session objects may form cycles: its weights go now
    try:
        session = _session(rewritten, providers)
    except Exception as e:
        return f"onnxruntime {ort.__version__} cannot load the rewritten model: {e}"
    if use_reference:
        names = [o.name for o in session.get_outputs()]
        try:
            feeds = make_feeds(session)
        except ValueError as e:
            return f"cannot check the rewrite: {e}"
    how = ("onnx's reference evaluator, com.microsoft::GroupNorm in float64 numpy" if use_reference
           else f"onnxruntime {ort.__version__}{ran_as}")
    print(f"\ncheck: {runs} run(s) on random inputs; original in {how}, rewritten in onnxruntime "
          f"{ort.__version__} with opbridge ({', '.join(providers)})", file=out)
    tol_text = (f"{tol:g}" if tol is not None else
                "1e-3 (float32, float64), 2e-2 (float16), 5e-2 (bfloat16), exact (integers)")
    print(f"  agreement required per output: max |rewritten - original| <= tol * max(1, max |original|); "
          f"tol {tol_text}", file=out)
    worst: dict[str, tuple[float, str]] = {}
    failure = ""
    for run in range(runs):
        if use_reference:
            try:
                ref = _reference_outputs(original, feeds[run], names)
            except Exception as e:
                return f"running the original model failed: {e}"
        else:
            ref = refs[run]
        try:
            got = session.run(names, feeds[run])
        except Exception as e:
            return f"running the rewritten model failed: {e}"
        if run == 0:
            for arg, value in feeds[run].items():
                print(f"  input  {arg}: {value.dtype} {list(value.shape)}", file=out)
        for name, g, r in zip(names, got, ref):
            t = tol if tol is not None else tolerance_for(np.asarray(r).dtype)
            ratio, summary = compare(g, r, t)
            if name not in worst or ratio > worst[name][0]:
                worst[name] = (ratio, f"{np.asarray(r).dtype} {list(np.shape(r))}: {summary}")
            if ratio > 1 and not failure:
                failure = f"output {name!r} disagrees on run {run + 1}: {summary}"
    session = None
    _release(nbytes)
    for name, (ratio, summary) in worst.items():
        print(f"  output {name}: {summary}{'' if ratio <= 1 else '  DISAGREES'}", file=out)
    return failure


def optimize(input_path: str, output_path: str, *, silu: bool = True, providers: Sequence[str] | None = None,
             dims: Mapping[str, int] | None = None, runs: int = DEFAULT_RUNS, tolerance: float | None = None,
             seed: int = 0, out: TextIO | None = None, max_memory: int | None = None) -> Report:
    """Rewrites the model at ``input_path``, checks it and writes it to ``output_path`` (with its
    external data file beside it when the input had external data or its tensors pass
    AUTO_EXTERNAL_BYTES). Nothing is written when the check fails; the input files are only read.

    max_memory: bytes; a model whose estimated peak (``estimated_peak``) exceeds it is refused
    (MemoryError) before its tensors are read. Unreadable input: UnreadableModel; a file that
    cannot be written (a full disk): WriteError; both name the file and the reason."""
    out = out or sys.stdout
    providers = list(providers or ["CPUExecutionProvider"])
    input_path, output_path = os.fspath(input_path), os.fspath(output_path)
    report = Report()
    preflight(input_path, output_path, max_memory)
    start = time.perf_counter()
    print(f"opbridge optimize: {input_path} -> {output_path}", file=out)
    # A file the reader refuses is exit status 2, as in `opbridge check`. A model whose nodes of our
    # (or a registered library's) ops do not fit those ops is refused as `opbridge check` and
    # InferenceSession refuse it (written unchanged, it would only fail later), and a graph that is
    # read but malformed fails like a model ONNX Runtime cannot load (check's verdict): status 1.
    proto = _reader.read_graph(input_path)
    problems = model_problems(proto)
    if problems:
        return _not_written(report, f"{_reader.INVALID_MODEL} " + "; ".join(problems), output_path, out)
    try:
        model = _reader.to_ir(proto, input_path)
    except _reader.MalformedGraph as e:
        return _not_written(report, f"cannot rewrite {input_path}: its graph is malformed "
                                    f"({_reader.short(e.__cause__ or e)})", output_path, out)
    del proto
    external = uses_external_data(model)
    nbytes = tensor_bytes(model)
    check_memory(input_path, nbytes, external, max_memory)  # exact now
    external = external or nbytes > AUTO_EXTERNAL_BYTES
    log.info("read %s: %.3f s", input_path, time.perf_counter() - start)
    start = time.perf_counter()
    try:
        result = report.result = rewrite_model(model, silu=silu)
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - the rewriter's failure on a malformed graph, whatever its type
        return _not_written(report, f"cannot rewrite {input_path}: its graph is malformed ({type(e).__name__}: "
                                    f"{_reader.short(e)})", output_path, out)
    log.info("rewrite: %.3f s", time.perf_counter() - start)

    if result.changed:
        print(f"rewritten into {DOMAIN} ops:", file=out)
        width = max(len(k) for k in result.counts)
        for label, n in result.counts.items():
            if n:
                print(f"  {label:{width}s}  x{n}", file=out)
    else:
        print("no GroupNorm pattern found, nor multi-scale deformable attention: the model is unchanged", file=out)
        # Written as read (the rules' shape inference filled in value types it need not keep).
        model = None
        _release(nbytes)
        model = load(input_path)
    if result.skipped:
        print("left unchanged:", file=out)
        for note in result.skipped:
            print(f"  {note}", file=out)

    folder = os.path.dirname(os.path.abspath(output_path))
    # Written to a scratch folder beside the destination first: checked from there, then renamed
    # into place, so that a failed check or write leaves nothing behind and IN may equal OUT.
    with writing(output_path):
        os.makedirs(folder, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix=".opbridge-optimize-", dir=folder)
    try:
        tmp_model = os.path.join(scratch, os.path.basename(output_path))
        start = time.perf_counter()
        with writing(output_path):
            save(model, tmp_model, external)
        log.info("write: %.3f s", time.perf_counter() - start)
        model = None
        _release(nbytes)  # the model's graph forms cycles: its tensors go now, before the check
        if result.changed:
            start = time.perf_counter()
            failure = check_against(input_path, tmp_model, providers=providers, dims=dims or {}, runs=runs,
                                    tol=tolerance, out=out, seed=seed, nbytes=nbytes)
            log.info("check against the original: %.3f s", time.perf_counter() - start)
            if failure:
                return _not_written(report, failure, output_path, out)
        moved = []
        data = os.path.join(scratch, data_file_name(output_path))
        with writing(output_path):
            if os.path.exists(data):
                os.replace(data, os.path.join(folder, data_file_name(output_path)))
                moved.append(os.path.join(os.path.dirname(output_path), data_file_name(output_path)))
            os.replace(tmp_model, output_path)
        moved.insert(0, output_path)
        report.written = moved
        print(f"\nwrote {' + '.join(moved)}", file=out)
        return report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _not_written(report: Report, failure: str, output_path: str, out: TextIO) -> Report:
    report.error = failure
    print(f"\nFAILED: {failure}", file=out)
    print(f"  {output_path} was not written.", file=out)
    return report
