"""Two builds of libopbridge_ort.so side by side in one process: a change that should not move
speed (a refactoring, a new compiler) is checked with this.

    python benchmarks/compare_ort_libraries.py OLD_LIB NEW_LIB [--threads 1] [--rounds 31] [--runs 3]
        [--group-norm N,C,H,W[,silu] ...] [--rtol R]

Each case is one model in two InferenceSessions, one per library, on the same inputs; the outputs
must be bitwise equal (the kernels are the same arithmetic) or the script stops; --rtol R accepts
outputs within R of each other relative to the largest magnitude (two builds whose arithmetic
differs: an older release against this one) and prints the difference. Rounds alternate
which library goes first; in a round each side's time is the mean of enough calls to take ~20 ms;
a run's figure is the median over rounds of new/old, and the case's figure the median of the runs
(the spread of the runs is printed beside it). A case that one library cannot load (an op an older
build lacks) is skipped with the reason. One ORT thread by default: on a 2-vCPU VM two
threads add scheduling noise of ±15 % that hides a 5 % change. The cases are the smallest shapes
of the asv suite (GroupNorm, Inverse, MultiScaleDeformableAttention, float32) and one call of each
point-cloud op; --group-norm gives GroupNorm shapes (32 groups) to time instead of all that.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

Feed = dict[str, np.ndarray]


def _model(op: str, feed: Feed, n_outputs: int = 1, **attrs: object) -> bytes:
    def info(name: str, a: np.ndarray) -> object:
        elem = TensorProto.INT64 if a.dtype == np.int64 else TensorProto.FLOAT
        return helper.make_tensor_value_info(name, elem, None)

    outs = [f"Y{i}" for i in range(n_outputs)]
    node = helper.make_node(op, list(feed), outs, domain="ai.opbridge", **attrs)
    graph = helper.make_graph([node], "g", [info(k, v) for k, v in feed.items()],
                              [helper.make_empty_tensor_value_info(o) for o in outs])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.opbridge", 3)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString()


def group_norm_case(spec: str) -> tuple[tuple[int, ...], str | None]:
    """'N,C,H,W' or 'N,C,H,W,silu' as (shape, activation)."""
    parts = spec.split(",")
    act = parts.pop() if parts and parts[-1] == "silu" else None
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1 or shape[1] % 32:
        raise argparse.ArgumentTypeError(f"--group-norm: expected N,C,H,W[,silu] with C a multiple of 32, got {spec!r}")
    return shape, act


def cases(rng: np.random.Generator, group_norm: list[tuple[tuple[int, ...], str | None]] | None = None
          ) -> list[tuple[str, bytes, Feed]]:
    out: list[tuple[str, bytes, Feed]] = []
    f32 = np.float32
    for shape, act in group_norm or [((1, 64, 56, 56), None), ((2, 32, 8, 8), None), ((1, 64, 16, 16), "silu"),
                                     ((8, 256, 32, 32), None)]:
        feed = {"X": rng.standard_normal(shape, dtype=f32), "s": rng.standard_normal(shape[1], dtype=f32),
                "b": rng.standard_normal(shape[1], dtype=f32)}
        attrs: dict[str, object] = {"num_groups": 32} | ({"activation": act} if act else {})
        out.append((f"GroupNorm {shape}{' silu' if act else ''}", _model("GroupNorm", feed, **attrs), feed))
    if group_norm:
        return out
    for shape in [(64, 4, 4), (8, 16, 16), (1, 3, 3), (4096, 3, 3)]:
        a = rng.standard_normal(shape, dtype=f32) + np.eye(shape[-1], dtype=f32) * shape[-1]
        out.append((f"Inverse {shape}", _model("Inverse", {"X": a}), {"X": a}))
    for n, lq, levels in [(1, 100, [(16, 16), (8, 8), (4, 4), (2, 2)]), (2, 1000, [(32, 32), (16, 16), (8, 8), (4, 4)])]:
        heads, dim, points = 8, 32, 4
        ss = np.array(levels, dtype=np.int64)
        sizes = ss[:, 0] * ss[:, 1]
        w = rng.random((n, lq, heads, len(levels), points), dtype=f32)
        w /= w.sum(axis=(-1, -2), keepdims=True)
        feed = {"value": rng.standard_normal((n, int(sizes.sum()), heads, dim), dtype=f32), "spatial_shapes": ss,
                "level_start_index": np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64),
                "sampling_locations": rng.random((n, lq, heads, len(levels), points, 2), dtype=f32),
                "attention_weights": w}
        out.append((f"MSDA N={n} Lq={lq} S={int(sizes.sum())}",
                     _model("MultiScaleDeformableAttention", feed), feed))
    b, n, m, c, k = 2, 4096, 512, 16, 16
    xyz = rng.standard_normal((b, n, 3), dtype=f32)
    centers = xyz[:, :m].copy()
    feats = rng.standard_normal((b, c, n), dtype=f32)
    idx = rng.integers(0, n, (b, m, k), dtype=np.int64)
    nn_idx = rng.integers(0, m, (b, n, 3), dtype=np.int64)
    weight = rng.random((b, n, 3), dtype=f32)
    out += [
        ("furthest_point_sample 2x4096->512", _model("FurthestPointSample", {"xyz": xyz}, num_points=m), {"xyz": xyz}),
        ("ball_query 2x4096, 512x16", _model("BallQuery", {"xyz": xyz, "c": centers}, min_radius=0.0,
                                             max_radius=0.4, sample_num=k), {"xyz": xyz, "c": centers}),
        ("knn 2x4096, 512x16", _model("KNN", {"xyz": xyz, "c": centers}, k=k), {"xyz": xyz, "c": centers}),
        ("grouping_operation 2x16x4096 -> 512x16", _model("GroupingOperation", {"f": feats, "i": idx}),
         {"f": feats, "i": idx}),
        ("gather_points 2x16x4096 -> 512", _model("GatherPoints", {"f": feats, "i": idx[:, :, 0].copy()}),
         {"f": feats, "i": idx[:, :, 0].copy()}),
        ("three_nn 2x4096 <- 512", _model("ThreeNN", {"t": xyz, "s": centers}, n_outputs=2), {"t": xyz, "s": centers}),
        ("three_interpolate 2x16x512 -> 4096", _model("ThreeInterpolate", {"f": feats[:, :, :m].copy(), "i": nn_idx,
                                                                           "w": weight}),
         {"f": feats[:, :, :m].copy(), "i": nn_idx, "w": weight}),
    ]
    return out


def _mean_time(fn: Callable[[], object], reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=31)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("-k", default="", help="only the cases whose name contains this")
    p.add_argument("--group-norm", nargs="+", type=group_norm_case, metavar="N,C,H,W[,silu]",
                   help="time GroupNorm (32 groups) at these shapes instead of the default cases")
    p.add_argument("--rtol", type=float, default=None,
                   help="accept outputs that differ by at most this much relative to their largest magnitude")
    a = p.parse_args()

    def session(model: bytes, lib: str) -> ort.InferenceSession:
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.register_custom_ops_library(lib)
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])

    print(f"threads={a.threads} rounds={a.rounds} runs={a.runs}; new/old: median of runs [min-max]")
    for name, model, feed in cases(np.random.default_rng(0), a.group_norm):
        if a.k not in name:
            continue
        try:
            s_old, s_new = session(model, a.old), session(model, a.new)
        except (ort_errors.Fail, ort_errors.InvalidArgument) as e:  # an op that one of the builds lacks
            print(f"{name:42s} skipped: {str(e).splitlines()[0][:80]}")
            continue
        diff = 0.0
        for y_old, y_new in zip(s_old.run(None, feed), s_new.run(None, feed)):
            if np.array_equal(y_old, y_new, equal_nan=y_old.dtype.kind == "f"):
                continue
            if a.rtol is None or y_old.dtype.kind != "f":
                raise SystemExit(f"{name}: the two libraries' outputs differ")
            scale = max(float(np.max(np.abs(y_old))), np.finfo(np.float32).tiny)
            diff = max(diff, float(np.max(np.abs(y_old.astype(np.float64) - y_new))) / scale)
            if not diff <= a.rtol:
                raise SystemExit(f"{name}: the two libraries' outputs differ by {diff:.3g} (--rtol {a.rtol})")
        run_old = functools.partial(s_old.run, None, feed)
        run_new = functools.partial(s_new.run, None, feed)
        reps = max(3, min(2000, int(0.02 / max(_mean_time(run_old, 5), 1e-7))))
        figures, t_old, t_new = [], [], []
        for _ in range(a.runs):
            ratios = []
            for r in range(a.rounds):
                if r % 2:
                    o, n_ = _mean_time(run_old, reps), _mean_time(run_new, reps)
                else:
                    n_, o = _mean_time(run_new, reps), _mean_time(run_old, reps)
                ratios.append(n_ / o)
                t_old.append(o)
                t_new.append(n_)
            figures.append(statistics.median(ratios))
        print(f"{name:42s} old {statistics.median(t_old) * 1e6:9.1f} us  new {statistics.median(t_new) * 1e6:9.1f} us"
              f"  new/old {statistics.median(figures):.3f} [{min(figures):.3f}-{max(figures):.3f}]"
              + (f"  outputs differ by {diff:.2g}" if diff else ""))


if __name__ == "__main__":
    main()
