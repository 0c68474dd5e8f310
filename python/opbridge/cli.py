"""The ``opbridge`` command line: info, demo, check, optimize, new-op, pt2, --cmake-dir."""

from __future__ import annotations

import argparse
import sys


def _cmd_info(args: argparse.Namespace) -> int:
    import importlib.util

    import opbridge

    print(f"opbridge {opbridge.__version__}")
    info = opbridge.build_info()
    for key in ("torch_version", "torch_target", "ort_api_version", "eigen_version", "cuda", "cuda_version",
                "compiler"):
        print(f"  built {key:16s} {info.get(key, '?')}")
    print(f"  ORT library            {opbridge.get_library_path()}")
    try:
        import onnxruntime as ort

        print(f"  onnxruntime            {ort.__version__} (providers: {', '.join(ort.get_available_providers())})")
    except ImportError:
        from ._ort import ORT_HINT

        print(f"  onnxruntime            not installed ({ORT_HINT})")
    if importlib.util.find_spec("torch") is not None:
        import torch

        print(f"  torch                  {torch.__version__} (CUDA available: {torch.cuda.is_available()})")
        try:
            import opbridge.ops  # noqa: F401  (registers the torch ops)
        except ImportError as e:
            print(f"  torch ops              unavailable: {e}")
        else:
            ns = torch.ops.opbridge
            ops = sorted(
                n for n in dir(ns)
                if isinstance(getattr(ns, n, None), torch._ops.OpOverloadPacket)
                and not n.endswith("_backward") and not n.startswith("_")
            )
            print(f"  torch ops              {', '.join('torch.ops.opbridge.' + n for n in ops)}")
            fast = hasattr(ns, "_no_grad_fast_path")
            print(f"  torch fast path        {'loaded' if fast else 'not loaded (built for torch ' + info.get('torch_version', '?') + ')'}")
    else:
        print("  torch                  not installed (torch ops unavailable)")
    print(f"  ONNX domain            {opbridge.DOMAIN}")
    from ._decl import opbridge_library

    lib = opbridge_library()
    ops = ", ".join(f"{lib.domain}::{op.onnx_type} (v{'-v'.join(map(str, sorted({op.since, op.latest})))})"
                    for op in sorted(lib.ops.values(), key=lambda o: o.onnx_type))
    print(f"  ONNX ops               {ops} (domain version {lib.domain_version})")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    return run_demo(out_dir=args.out_dir, repeats=args.repeats)


def _missing(command: str, e: ImportError) -> int:
    from ._ort import missing_message

    print(missing_message(command, e), file=sys.stderr)
    return 2


def _cmd_check(args: argparse.Namespace) -> int:
    try:
        from ._check import main as check_main
    except ImportError as e:
        return _missing("check", e)

    return check_main(args.model, providers=args.provider, dims=args.dim, run=not args.no_run,
                      libraries=args.library, discover=not args.no_discover, stock=args.stock)


def _cmd_optimize(args: argparse.Namespace) -> int:
    try:
        from ._optimize import main as optimize_main
    except ImportError as e:
        return _missing("optimize", e)

    return optimize_main(args.input, args.output, silu=not args.no_silu, providers=args.provider, dims=args.dim,
                         runs=args.runs, tolerance=args.tolerance, seed=args.seed, max_memory=args.max_memory)


def _cmd_new_op(args: argparse.Namespace) -> int:
    from ._newop import new_op

    try:
        made = new_op(args.name, dir=args.dir, namespace=args.namespace, domain=args.domain, cuda=args.cuda)
    except ValueError as e:
        print(f"opbridge new-op: {e}", file=sys.stderr)
        return 2
    print(made)
    print(f"next: pip install --no-build-isolation {made.dir} && python -m pytest -q {made.dir / 'tests'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="opbridge", description=__doc__)
    p.add_argument("--cmake-dir", action="store_true",
                   help="print the folder of opbridgeConfig.cmake (for -Dopbridge_DIR=...) and exit")
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("info", help="versions, library path, ops, ONNX Runtime providers")
    d = sub.add_parser("demo", help="export a small conv net with opbridge ops with both exporters and run it in ORT")
    d.add_argument("--out-dir", default="opbridge-demo", help="where to write the .onnx files (default: %(default)s)")
    d.add_argument("--repeats", type=int, default=20, help="timed runs per implementation (default: %(default)s)")
    c = sub.add_parser(
        "check",
        help="list the custom ops a model uses and who provides them, then run it once on random inputs "
        "(exit status 1 when something is missing or the run fails)",
    )
    c.add_argument("model", help="path of the .onnx file")
    c.add_argument("--provider", action="append", default=None,
                   help="execution provider to use (repeatable; default: CPUExecutionProvider)")
    c.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic input dimension (repeatable; others get 2)")
    c.add_argument("--no-run", action="store_true", help="only list the ops and their providers")
    c.add_argument("--library", action="append", default=[], metavar="PATH",
                   help="a custom-op library of your own ops built on opbridge (repeatable)")
    c.add_argument("--no-discover", action="store_true",
                   help="do not register the libraries installed packages announce (entry points "
                        "'opbridge.libraries'; without this flag, one that fails or takes over "
                        "OPBRIDGE_DISCOVER_TIMEOUT seconds, default 5, is named and skipped)")
    c.add_argument("--stock", action="store_true",
                   help="how the model fares on stock ONNX Runtime: no custom-op library registered")
    o = sub.add_parser(
        "optimize",
        help="rewrite GroupNorm forms (torch's decompositions, GroupNormalization-18/21, com.microsoft::GroupNorm) "
        "and a following SiLU into ai.opbridge::GroupNorm, check the result against the original on random "
        "inputs, and write it (exit status 1 and nothing written when they disagree); see docs/optimize.md",
    )
    o.add_argument("input", help="path of the .onnx file to read (external data is read from beside it)")
    o.add_argument("output", help="path of the .onnx file to write (external data goes to OUTPUT.data beside it "
                                  "when the input had external data)")
    o.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic input dimension for the check (repeatable; others get 2)")
    o.add_argument("--provider", action="append", default=None,
                   help="execution provider of the check (repeatable; default: CPUExecutionProvider)")
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
    n = sub.add_parser(
        "new-op",
        help="scaffold a project of your own op (declarations, CPU kernels and their compute functions, Python "
        "package, tests), or add an op to such a project",
    )
    n.add_argument("name", help="the op's snake_case name, e.g. rms_norm")
    n.add_argument("--dir", default=None, help="the project folder (default: ./NAME); an existing project gets the op added")
    n.add_argument("--namespace", default=None,
                   help="torch namespace, C++ namespace and Python package (default: the folder's name)")
    n.add_argument("--domain", default=None, help="ONNX domain of the ops (default: com.example.NAMESPACE)")
    n.add_argument("--cuda", action="store_true", help="also a CUDA kernel and its compute function")
    a = sub.add_parser(
        "pt2",
        help="list the custom ops an AOTInductor package (.pt2) calls, the op library of each, and whether they "
        "load into this torch (exit status 1 when one is missing or does not load); see docs/deploy.md",
    )
    a.add_argument("package", help="path of the .pt2 file (torch._inductor.aoti_compile_and_package)")
    a.add_argument("--json", action="store_true", help="print the report as JSON")
    a.add_argument("--libraries", action="store_true",
                   help="print only the op libraries to load before the package, one path per line (for "
                        "OPBRIDGE_TORCH_LIBRARIES or opbridge::load_torch_ops)")
    a.add_argument("--no-load", action="store_true", help="do not check that the libraries load")
    args = p.parse_args(argv)
    if args.cmake_dir:
        from ._cmake import cmake_dir

        print(cmake_dir())
        return 0
    if args.cmd is None:
        p.error("a command is required (info, demo, check, optimize) unless --cmake-dir is given")
        p.error("a command is required (info, demo, check, new-op) unless --cmake-dir is given")
    if args.cmd == "info":
        return _cmd_info(args)
    if args.cmd == "demo":
        return _cmd_demo(args)
    if args.cmd == "check":
        return _cmd_check(args)
    if args.cmd == "optimize":
        return _cmd_optimize(args)
    if args.cmd == "new-op":
        return _cmd_new_op(args)
    if args.cmd == "pt2":
        from .aoti import _main_pt2

        return _main_pt2(args.package, args.json, args.libraries, not args.no_load)
    p.error(f"unknown command {args.cmd}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
