"""The opbridge command line: info, demo, check, optimize, new-op, pt2.

Reports go to stdout (with --json: one JSON document, described by the schemas in docs/schemas/),
diagnostics to stderr through the "opbridge" logger (-v: also what each stage did and how long it
took; -q: errors only). Exit status: 0 success; 1 the model or package failed what the command
checks; 2 bad arguments, an input that cannot be read, or a missing dependency; 130 interrupted;
141 stdout was closed early (e.g. piped into head). docs/cli.md has the details.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import mmap
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ._protobuf import fields, varint

if TYPE_CHECKING:
    from . import _check, _optimize, aoti

# Version of the JSON documents the commands print (their "format_version"): raised when a field
# is removed or changes meaning, not when one is added.
JSON_FORMAT_VERSION = 1
# 128 + SIGPIPE, what a shell reports for a program that a closed pipe ended.
EXIT_BROKEN_PIPE = 141
# 128 + SIGINT.
EXIT_INTERRUPTED = 130
COMMANDS = ("info", "demo", "check", "optimize", "new-op", "pt2")

log = logging.getLogger("opbridge")


class UsageError(Exception):
    """A command-line argument that is wrong: exit status 2, the message on stderr."""


# --------------------------------------------------------------------------------------------
# logging: diagnostics on stderr, prefixed with the command
# --------------------------------------------------------------------------------------------


class _StderrHandler(logging.Handler):
    """Writes to the sys.stderr of the moment (not the one at creation), so that a caller that
    swaps sys.stderr (pytest's capsys, contextlib.redirect_stderr) sees the messages."""

    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog

    def emit(self, record: logging.LogRecord) -> None:
        try:
            kind = {logging.WARNING: "warning: ", logging.DEBUG: "debug: "}.get(record.levelno, "")
            # A message that names the command itself ("opbridge check needs ONNX Runtime ...").
            prefix = "" if getattr(record, "bare", False) else f"{self.prog}: {kind}"
            sys.stderr.write(f"{prefix}{record.getMessage()}\n")
        except BrokenPipeError:
            raise
        except Exception:
            self.handleError(record)


class _Logging:
    """The "opbridge" logger set up for one command and put back as it was afterwards: using the
    command line from Python leaves no handler behind."""

    def __init__(self, prog: str, verbosity: int) -> None:
        self.handler = _StderrHandler(prog)
        # -q: errors only; default: warnings; -v: info (stages and their times); -vv: debug.
        self.level = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO}.get(
            max(-1, min(verbosity, 2)), logging.DEBUG)

    def __enter__(self) -> _Logging:
        self.saved = (log.level, log.propagate)
        log.setLevel(self.level)
        log.propagate = False
        log.addHandler(self.handler)
        return self

    def __exit__(self, *exc: object) -> None:
        log.removeHandler(self.handler)
        log.setLevel(self.saved[0])
        log.propagate = self.saved[1]


class _Stage:
    """Logs at -v how long a stage of a command took."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> _Stage:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        log.info("%s: %.3f s", self.name, time.perf_counter() - self.start)


# --------------------------------------------------------------------------------------------
# the model's header, read without its tensors
# --------------------------------------------------------------------------------------------


@dataclass
class ModelHeader:
    """What a command needs to know of a model before it loads it: its IR version, the opsets it
    imports and its graph's inputs with their dimensions (int, str for a symbolic one, None for
    an unknown one)."""

    ir_version: int = 0
    opsets: dict[str, int] = field(default_factory=dict)
    inputs: list[tuple[str, list[int | str | None]]] = field(default_factory=list)

    def dim_names(self) -> list[str]:
        return sorted({d for _, dims in self.inputs for d in dims if isinstance(d, str)})


def read_header(path: str) -> ModelHeader:
    """The header of the ONNX file at ``path``, read by walking the protobuf fields of the model
    and its graph: the initializers are skipped over, never parsed, so that this costs the same
    for a 2 GB model as for a small one. ValueError when the file is not a model."""
    import onnx

    # ModelProto: ir_version 1, graph 7, opset_import 8; GraphProto: input 11;
    # OperatorSetIdProto: domain 1, version 2.
    header = ModelHeader()
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ValueError("empty file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                for number, _, _, start, end in fields(buf, 0, len(buf)):
                    if number == 1:
                        header.ir_version = varint(buf, start, end)[0]
                    elif number == 8:
                        opset = onnx.OperatorSetIdProto.FromString(buf[start:end])
                        header.opsets[opset.domain or "ai.onnx"] = opset.version
                    elif number == 7:
                        for g_number, _, _, g_start, g_end in fields(buf, start, end):
                            if g_number == 11:
                                info = onnx.ValueInfoProto.FromString(buf[g_start:g_end])
                                dims: list[int | str | None] = [
                                    d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                    for d in info.type.tensor_type.shape.dim]
                                header.inputs.append((info.name, dims))
            except Exception as e:  # a field past the end, protobuf's DecodeError
                raise ValueError(f"not an ONNX model ({e})") from e
    if header.ir_version <= 0:
        raise ValueError("not an ONNX model (no IR version)")
    return header


# --------------------------------------------------------------------------------------------
# arguments shared by check and optimize
# --------------------------------------------------------------------------------------------


def _run_options(parser: argparse.ArgumentParser, *, provider: str, dim: str) -> None:
    """--provider and --dim, which check and optimize read alike (check_providers, parse_dims)."""
    parser.add_argument("--provider", action="append", default=None,
                        help=f"{provider}, one the installed onnxruntime has (repeatable; default: CPUExecutionProvider)")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                        help=f"{dim} (repeatable; others get 2)")


def parse_dims(items: Sequence[str], header: ModelHeader | None) -> dict[str, int]:
    """--dim NAME=SIZE items -> {name: size}; UsageError for a malformed item or, when the model's
    header is known, a name that none of its inputs' dimensions has."""
    parsed: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit():
            raise UsageError(f"--dim expects NAME=SIZE with SIZE >= 0, got {item!r}")
        parsed[name] = int(value)
    if header is not None:
        known = header.dim_names()
        for name in parsed:
            if name not in known:
                names = ", ".join(known) if known else "none: every input dimension is fixed"
                raise UsageError(f"--dim {name}=...: the model's inputs have no dimension named {name!r} "
                                 f"(their named dimensions: {names})")
    return parsed


def check_providers(providers: Sequence[str] | None) -> list[str]:
    """The execution providers asked for (default: CPUExecutionProvider), each one that the
    installed ONNX Runtime has; UsageError naming the one it lacks and those it has."""
    from ._ort import import_onnxruntime

    ort = import_onnxruntime()
    if not providers:
        return ["CPUExecutionProvider"]
    available = list(ort.get_available_providers())
    for p in providers:
        if p in available:
            continue
        have = f"this one has {', '.join(available)}"
        if p in ort.get_all_providers():
            hint = ""
            if p.startswith(("CUDA", "Tensorrt")):
                hint = ' (pip install "opbridge[onnxruntime-gpu]" in place of the CPU distribution)'
            raise UsageError(f"--provider {p}: this onnxruntime {ort.__version__} is built without it; "
                             f"{have}{hint}")
        raise UsageError(f"--provider expects an execution provider of onnxruntime, got {p!r}; {have}")
    return list(providers)


def _existing_file(path: str) -> str:
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    return path


def _header_or_none(path: str) -> ModelHeader | None:
    """The header, or None when the file cannot be read as a model (the command then says why
    in its own words)."""
    try:
        return read_header(path)
    except (OSError, ValueError) as e:
        log.debug("%s: header not read: %s", path, e)
        return None


def _print_json(doc: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(doc, indent=1) + "\n")


# --------------------------------------------------------------------------------------------
# info
# --------------------------------------------------------------------------------------------


def _info() -> dict[str, Any]:
    """What ``opbridge info`` reports, as the JSON document of ``opbridge info --json``."""
    import importlib.util

    import opbridge

    from ._op_library import opbridge_library

    doc: dict[str, Any] = {"format_version": JSON_FORMAT_VERSION, "command": "info",
                           "opbridge": opbridge.__version__, "build": opbridge.build_info(),
                           "library_path": opbridge.get_library_path()}
    try:
        from ._ort import import_onnxruntime

        ort = import_onnxruntime()
    except ImportError as e:
        doc["onnxruntime"] = {"installed": False, "error": str(e)}
    else:
        doc["onnxruntime"] = {"installed": True, "version": ort.__version__,
                              "providers": list(ort.get_available_providers())}
    torch_doc: dict[str, Any] = {"installed": importlib.util.find_spec("torch") is not None}
    if torch_doc["installed"]:
        import torch

        torch_doc.update(version=str(torch.__version__), cuda_available=bool(torch.cuda.is_available()))
        try:
            import opbridge.ops  # noqa: F401  (registers the torch ops)
        except ImportError as e:
            torch_doc.update(ops=[], error=str(e), fast_path=False)
        else:
            ns = torch.ops.opbridge
            torch_doc["ops"] = sorted(
                "torch.ops.opbridge." + n for n in dir(ns)
                if isinstance(getattr(ns, n, None), torch._ops.OpOverloadPacket)
                and not n.endswith("_backward") and not n.startswith("_"))
            torch_doc["fast_path"] = hasattr(ns, "_no_grad_fast_path")
    doc["torch"] = torch_doc
    lib = opbridge_library()
    doc["onnx"] = {"domain": lib.domain, "domain_version": lib.domain_version,
                   "ops": [{"op_type": op.onnx_type, "since": op.since, "latest": op.latest}
                           for op in sorted(lib.ops.values(), key=lambda o: o.onnx_type)]}
    return doc


def _info_text(doc: dict[str, Any]) -> str:
    lines = [f"opbridge {doc['opbridge']}"]
    for key in ("torch_version", "torch_target", "ort_api_version", "eigen_version", "cuda", "cuda_version",
                "compiler"):
        lines.append(f"  built {key:16s} {doc['build'].get(key, '?')}")
    lines.append(f"  ORT library            {doc['library_path']}")
    o = doc["onnxruntime"]
    if o["installed"]:
        lines.append(f"  onnxruntime            {o['version']} (providers: {', '.join(o['providers'])})")
    else:
        from ._ort import ORT_HINT

        lines.append(f"  onnxruntime            not installed ({ORT_HINT})")
    t = doc["torch"]
    if not t["installed"]:
        lines.append("  torch                  not installed (torch ops unavailable)")
    else:
        lines.append(f"  torch                  {t['version']} (CUDA available: {t['cuda_available']})")
        if "error" in t:
            lines.append(f"  torch ops              unavailable: {t['error']}")
        else:
            lines.append(f"  torch ops              {', '.join(t['ops'])}")
            built_for = doc["build"].get("torch_version", "?")
            lines.append(f"  torch fast path        "
                         f"{'loaded' if t['fast_path'] else 'not loaded (built for torch ' + built_for + ')'}")
    n = doc["onnx"]
    lines.append(f"  ONNX domain            {n['domain']}")
    ops = ", ".join(f"{n['domain']}::{op['op_type']} (v{'-v'.join(map(str, sorted({op['since'], op['latest']})))})"
                    for op in n["ops"])
    lines.append(f"  ONNX ops               {ops} (domain version {n['domain_version']})")
    return "\n".join(lines)


def _cmd_info(args: argparse.Namespace) -> int:
    with _Stage("info"):
        doc = _info()
    if args.json:
        _print_json(doc)
    elif args.verbosity >= 0:
        print(_info_text(doc))
    return 0


# --------------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------------


def check_json(path: str, report: _check.Report, header: ModelHeader | None, providers: Sequence[str],
               stock: bool) -> dict[str, object]:
    """The JSON document of ``opbridge check --json`` (docs/schemas/check.schema.json)."""
    from ._ort import import_onnxruntime
    from ._version import __version__

    missing = [u.name for u in report.missing]
    error = report.error or (f"no implementation here for "
                             f"{'; '.join(u.named() + (f': {u.note}' if u.note else '') for u in report.missing)}"
                             if missing else "")
    return {
        "format_version": JSON_FORMAT_VERSION,
        "command": "check",
        "model": path,
        "ir_version": header.ir_version if header else None,
        "opsets": header.opsets if header else None,
        "onnxruntime": import_onnxruntime().__version__,
        "providers": list(providers),
        "opbridge": __version__,
        "stock": stock,
        "skipped_libraries": [str(s) for s in report.skipped],
        "ops": [{"name": u.name, "domain": u.domain or "ai.onnx", "op_type": u.op_type, "count": u.count,
                 "provider": u.provider or None, "note": u.note or None} for u in report.ops],
        "missing": missing,
        "ran": bool(report.ran and not missing and not report.error),
        "inputs": list(report.inputs),
        "outputs": list(report.outputs),
        "ok": bool(report.ok),
        "error": error or None,
    }


def _cmd_check(args: argparse.Namespace) -> int:
    from ._check import check

    path = _existing_file(args.model)
    with _Stage("read the model's header"):
        header = _header_or_none(path)
    dims = parse_dims(args.dim, header)
    providers = check_providers(args.provider)
    log.info("providers: %s", ", ".join(providers))
    text = args.verbosity >= 0 and not args.json
    try:
        with _Stage("check"):
            report = check(path, providers=providers, dims=dims, run=not args.no_run, libraries=args.library,
                           discover=not args.no_discover, stock=args.stock, out=None if text else io.StringIO())
    except (OSError, ValueError) as e:  # an unreadable model (UnreadableModel), a --library that is not one
        raise UsageError(str(e)) from None
    if args.json:
        _print_json(check_json(path, report, header, providers, args.stock))
    elif not text and not report.ok:
        names = "; ".join(u.named() + (f": {u.note}" if u.note else "") for u in report.missing)
        log.error("%s: %s", path, report.error or f"no implementation here for {names}")
    return 0 if report.ok else 1


# --------------------------------------------------------------------------------------------
# optimize
# --------------------------------------------------------------------------------------------


def optimize_json(input_path: str, output_path: str, report: _optimize.Report, runs: int) -> dict[str, object]:
    """The JSON document of ``opbridge optimize --json`` (docs/schemas/optimize.schema.json)."""
    result = report.result
    changed = bool(result is not None and result.changed)
    return {
        "format_version": JSON_FORMAT_VERSION,
        "command": "optimize",
        "input": input_path,
        "output": output_path,
        "rewritten": {k: v for k, v in (result.counts.items() if result else ()) if v},
        "left_unchanged": list(result.skipped) if result else [],
        "checked_runs": runs if changed else 0,
        "written": list(report.written),
        "ok": bool(report.ok),
        "error": report.error or None,
    }


def _cmd_optimize(args: argparse.Namespace) -> int:
    from ._optimize import UnreadableModel, available_memory, optimize, parse_size
    from .onnx._external_data import WriteError

    try:
        limit = parse_size(args.max_memory) if args.max_memory is not None else available_memory()
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.runs < 1:
        raise UsageError(f"--runs must be >= 1, got {args.runs}")
    if args.tolerance is not None and not args.tolerance > 0:
        raise UsageError(f"--tolerance must be > 0, got {args.tolerance}")
    src = _existing_file(args.input)
    with _Stage("read the model's header"):
        header = _header_or_none(src)
    dims = parse_dims(args.dim, header)
    providers = check_providers(args.provider)
    text = args.verbosity >= 0 and not args.json
    try:
        with _Stage("optimize"):
            report = optimize(src, args.output, silu=not args.no_silu, providers=providers, dims=dims,
                              runs=args.runs, tolerance=args.tolerance, seed=args.seed, max_memory=limit,
                              out=None if text else io.StringIO())
    except (UnreadableModel, MemoryError, WriteError) as e:
        raise UsageError(str(e)) from None
    if args.json:
        _print_json(optimize_json(src, args.output, report, args.runs))
    elif not text and not report.ok:
        log.error("%s: %s (%s was not written)", src, report.error, args.output)
    return 0 if report.ok else 1


# --------------------------------------------------------------------------------------------
# demo, new-op, pt2
# --------------------------------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    if args.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
    # -q: no report; a failure is still logged as an error, and the exit status says it.
    return int(run_demo(out_dir=args.out_dir, repeats=args.repeats,
                        out=io.StringIO() if args.verbosity < 0 else None))


def _missing(command: str, e: ImportError) -> int:
    from ._ort import missing_message

    log.error("%s", missing_message(command, e), extra={"bare": True})
    return 2


def _cmd_new_op(args: argparse.Namespace) -> int:
    from ._newop import new_op

    try:
        made = new_op(args.name, dir=args.dir, namespace=args.namespace, domain=args.domain, cuda=args.cuda,
                      index_output=args.index_output)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.verbosity >= 0:
        print(made)
        print(f"next: pip install --no-build-isolation {made.dir} && python -m pytest -q {made.dir / 'tests'}")
    return 0


def pt2_json(report: aoti.PackageOps) -> dict[str, object]:
    """The JSON document of ``opbridge pt2 --json`` (docs/schemas/pt2.schema.json)."""
    return {"format_version": JSON_FORMAT_VERSION, "command": "pt2", **report.to_dict(), "ok": not report.problems}


def _cmd_pt2(args: argparse.Namespace) -> int:
    from .aoti import format_report, inspect_package

    try:
        with _Stage("inspect the package"):
            report = inspect_package(args.package, check_load=not args.no_load and not args.libraries)
    except ValueError as e:  # not an AOTInductor package; the message names the file
        raise UsageError(str(e)) from None
    if args.libraries:
        if args.verbosity >= 0:
            print("\n".join(report.library_paths()))
        return 0 if all(v is not None for v in report.libraries.values()) else 1
    if args.json:
        _print_json(pt2_json(report))
    elif args.verbosity >= 0:
        print(format_report(report))
    elif report.problems:
        log.error("%s: %s", args.package, "; ".join(report.problems))
    return 0 if not report.problems else 1


# --------------------------------------------------------------------------------------------
# the parser
# --------------------------------------------------------------------------------------------


def _verbosity_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    # On the main parser and on each command, so that -v works before and after the command's
    # name; a command's own default must not overwrite what was given before it.
    default = argparse.SUPPRESS if suppress else 0
    g = parser.add_mutually_exclusive_group()
    g.add_argument("-v", "--verbose", dest="verbosity", action="count", default=default,
                   help="also log what each stage does and how long it takes (stderr; -vv: more)")
    g.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1, default=default,
                   help="no report, only errors (stderr); the exit status gives the verdict")


def _json_option(parser: argparse.ArgumentParser, schema: str) -> None:
    parser.add_argument("--json", action="store_true",
                        help=f"print the report as one JSON document (fields: docs/cli.md, schema: docs/schemas/"
                             f"{schema}.schema.json); diagnostics still go to stderr")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``opbridge`` command."""
    from ._version import __version__

    p = argparse.ArgumentParser(prog="opbridge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"opbridge {__version__}")
    p.add_argument("--cmake-dir", action="store_true",
                   help="print the folder of opbridgeConfig.cmake (for -Dopbridge_DIR=...) and exit")
    _verbosity_options(p, suppress=False)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    def command(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help, description=description or help)
        _verbosity_options(c, suppress=True)
        return c

    i = command("info", "versions, library path, ops, ONNX Runtime providers")
    _json_option(i, "info")
    d = command("demo", "export two small models with opbridge ops with both exporters, run them in ONNX Runtime and "
                        "compare with PyTorch (about half a minute)")
    d.add_argument("--out-dir", default="opbridge-demo", help="where to write the .onnx files (default: %(default)s)")
    d.add_argument("--repeats", type=int, default=20, help="timed runs per implementation (default: %(default)s)")
    c = command(
        "check",
        "list the custom ops a model uses and who provides them, then run it once on random inputs "
        "(exit status 1 when something is missing or the run fails)",
    )
    c.add_argument("model", help="path of the .onnx file")
    _run_options(c, provider="execution provider to use", dim="size of a named input dimension of the model")
    c.add_argument("--no-run", action="store_true", help="only list the ops and their providers")
    c.add_argument("--library", action="append", default=[], metavar="PATH",
                   help="a custom-op library of your own ops built on opbridge (repeatable)")
    c.add_argument("--no-discover", action="store_true",
                   help="do not register the libraries installed packages announce (entry points "
                        "'opbridge.libraries'; without this flag, one that fails or takes over "
                        "OPBRIDGE_DISCOVER_TIMEOUT seconds, default 5, is named and skipped)")
    c.add_argument("--stock", action="store_true",
                   help="how the model fares on stock ONNX Runtime: no custom-op library registered")
    _json_option(c, "check")
    o = command(
        "optimize",
        "rewrite GroupNorm forms (torch's decompositions, GroupNormalization-18/21, com.microsoft::GroupNorm) "
        "and a following SiLU into ai.opbridge::GroupNorm, check the result against the original on random "
        "inputs, and write it (exit status 1 and nothing written when they disagree); see docs/optimize.md",
    )
    o.add_argument("input", help="path of the .onnx file to read (external data is read from beside it)")
    o.add_argument("output", help="path of the .onnx file to write (external data goes to OUTPUT.data beside it "
                                  "when the input had external data)")
    _run_options(o, provider="execution provider of the check", dim="size of a named input dimension for the check")
    o.add_argument("--no-silu", action="store_true", help="do not fuse SiLU into GroupNorm")
    o.add_argument("--runs", type=int, default=2, help="check runs, each on fresh random inputs (default: %(default)s)")
    o.add_argument("--tolerance", type=float, default=None,
                   help="max |rewritten - original| allowed, relative to max(1, max |original|) per output "
                        "(default: 1e-3 for float32/float64, 2e-2 for float16, 5e-2 for bfloat16)")
    o.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: %(default)s)")
    o.add_argument("--max-memory", default=None, metavar="SIZE",
                   help="refuse, before reading its tensors, a model whose rewrite and check would need more "
                        "memory than SIZE (e.g. 8G or 8GiB = 8 x 2**30 bytes, 8GB = 8 x 10**9, 512M; default: the "
                        "memory available now); see docs/optimize.md")
    _json_option(o, "optimize")
    n = command(
        "new-op",
        "scaffold a project of your own op (declarations, CPU kernels and their compute functions, Python "
        "package, tests), or add an op to such a project",
    )
    n.add_argument("name", help="the op's snake_case name, e.g. rms_norm")
    n.add_argument("--dir", default=None, help="the project folder (default: ./NAME); an existing project gets the op added")
    n.add_argument("--namespace", default=None,
                   help="torch namespace, C++ namespace and Python package (default: the folder's name)")
    n.add_argument("--domain", default=None, help="ONNX domain of the ops (default: com.example.NAMESPACE)")
    n.add_argument("--cuda", action="store_true", help="also a CUDA kernel and its compute function")
    n.add_argument("--index-output", action="store_true",
                   help="the op also returns int64 indices (an output without a gradient); CPU only")
    a = command(
        "pt2",
        "list the custom ops an AOTInductor package (.pt2) calls, the op library of each, and whether they "
        "load into this torch (exit status 1 when one is missing or does not load); see docs/deploy.md",
    )
    a.add_argument("package", help="path of the .pt2 file (torch._inductor.aoti_compile_and_package)")
    _json_option(a, "pt2")
    a.add_argument("--libraries", action="store_true",
                   help="print only the op libraries to load before the package, one path per line (for "
                        "OPBRIDGE_TORCH_LIBRARIES or opbridge::load_torch_ops)")
    a.add_argument("--no-load", action="store_true", help="do not check that the libraries load")
    return p


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "info": _cmd_info, "demo": _cmd_demo, "check": _cmd_check, "optimize": _cmd_optimize,
    "new-op": _cmd_new_op, "pt2": _cmd_pt2,
}


def _run(argv: Sequence[str] | None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.cmake_dir:
        from ._cmake import cmake_dir

        print(cmake_dir())
        return 0
    if args.cmd is None:
        p.error(f"a command is required ({', '.join(COMMANDS)}) unless --cmake-dir or --version is given")
    prog = f"opbridge {args.cmd}"
    with _Logging(prog, args.verbosity):
        try:
            return _COMMANDS[args.cmd](args)
        except UsageError as e:
            log.error("%s", e)
            return 2
        except ImportError as e:  # what the command needs is not installed: say what to install
            return _missing(args.cmd, e)
        finally:
            sys.stdout.flush()  # here, so that a closed pipe is seen while main() can still end quietly


def _quiet_stdout() -> None:
    """Points stdout at /dev/null: Python flushes it once more at exit, which would fail again."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, io.UnsupportedOperation):  # stdout without a file descriptor
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``opbridge`` command with ``argv`` (default: sys.argv[1:]); returns its exit status."""
    try:
        return _run(argv)
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
