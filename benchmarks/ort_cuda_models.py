"""ONNX Runtime on the GPU: opbridge's nodes against the subgraphs a plain export gives for the same
computation, in one process, on ORT's CUDA provider (no CPU fallback), inputs and outputs bound on
the device (IOBinding), each run ending in ORT's own stream synchronization (what a caller waits for).

    python benchmarks/ort_cuda_models.py [--provider cuda|cpu] [--json OUT] [--quick]

Cases (fp32 unless named; fp16 for GroupNorm too):
- GroupNorm+SiLU at Stable Diffusion 1.5's UNet and VAE shapes (G=32): our GroupNorm(activation=silu)
  against the plain export at opset 20 (Reshape, InstanceNormalization, Reshape, Mul, Add, Sigmoid,
  Mul), GroupNormalization-21 + Sigmoid/Mul, and com.microsoft::GroupNorm (NHWC, activation=1: what
  ORT's own Stable Diffusion optimizer writes; channels-last input, so its layout differs).
- Inverse against com.microsoft::Inverse (stock ORT), ours with on_singular="raise" (one read-back
  of the singular flag per call) and "nan" (none).
- MultiScaleDeformableAttention at Deformable DETR's COCO shapes (levels of 800x1066, 8 heads, 32
  channels, 4 points): encoder (batch 1, 17821 queries) and decoder (batch 2, 300 queries) against
  the GridSample chain that exporting Deformable DETR's pure-PyTorch attention gives (per level a
  Split slice, Transpose, Reshape and GridSample-16, then Concat, Mul and ReduceSum), built here node
  for node so no torch is needed.

Each case also checks that every variant computes the same values (max |difference| printed).
Times: medians over rounds that run each variant in turn (ratios from the same rounds). This file
measures; it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import opbridge

ONNX_DTYPE = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.float64: TensorProto.DOUBLE}


def _model(nodes, inputs, outputs, opset, initializers=(), ms=False):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    imports = [helper.make_opsetid("", opset), helper.make_opsetid(opbridge.DOMAIN, 2)]
    if ms:
        imports.append(helper.make_opsetid("com.microsoft", 1))
    return helper.make_model(g, opset_imports=imports, ir_version=10).SerializeToString()


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, ONNX_DTYPE[dtype], shape)


def _const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


class Runner:
    def __init__(self, provider: str):
        import onnxruntime as ort

        self.ort = ort
        self.device = "cuda" if provider == "cuda" else "cpu"
        self.providers = ["CUDAExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
        if provider == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
            sys.exit(f"this onnxruntime ({ort.__file__}) has no CUDAExecutionProvider")

    def session(self, model: bytes):
        so = self.ort.SessionOptions()
        so.log_severity_level = 3
        if self.device == "cuda":
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        return opbridge.InferenceSession(model, sess_options=so, providers=self.providers)

    def bound(self, sess, feeds: dict):
        b = sess.io_binding()
        keep = []
        for k, v in feeds.items():
            ov = self.ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v), self.device, 0)
            keep.append(ov)
            b.bind_ortvalue_input(k, ov)
        out = sess.get_outputs()[0].name
        b.bind_output(out, self.device, 0)

        def run():
            sess.run_with_iobinding(b)

        def result():
            sess.run_with_iobinding(b)
            return b.copy_outputs_to_cpu()[0]

        run.keep = keep
        return run, result


def timed(variants: dict, rounds: int, per_round: int) -> dict:
    """Median µs per call of each variant, the variants taking turns in every round."""
    for f in variants.values():
        for _ in range(3):
            f()
    per = {k: [] for k in variants}
    for _ in range(rounds):
        for k, f in variants.items():
            t0 = time.perf_counter()
            for _ in range(per_round):
                f()
            per[k].append((time.perf_counter() - t0) / per_round * 1e6)
    return {k: statistics.median(v) for k, v in per.items()}


def report(title: str, runner: Runner, builders: dict, feeds_for: dict, rounds: int, per_round: int, rows: list,
           base: str, post=None):
    """post: {variant: function} applied to that variant's output before the comparison."""
    runs, values, notes = {}, {}, {}
    for name, model in builders.items():
        try:
            sess = runner.session(model)
            run, result = runner.bound(sess, feeds_for[name])
            values[name] = (post or {}).get(name, lambda y: y)(result()).astype(np.float64)
            runs[name] = run
        except Exception as e:  # a variant this ORT cannot run here: say so, time the rest
            notes[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:140]}"
    times = timed(runs, rounds, per_round) if runs else {}
    ref = values.get(base)
    print(f"\n{title}")
    for name in builders:
        if name in notes:
            print(f"  {name:<34} n/a ({notes[name]})")
            rows.append({"case": title, "variant": name, "error": notes[name]})
            continue
        diff = float(np.max(np.abs(values[name] - ref))) if ref is not None and values[name].shape == ref.shape else None
        speed = times[base] and times[name] / times[base] if base in times else None
        print(f"  {name:<34} {times[name]:10.1f} us" + (f"   {speed:5.2f}x ours" if speed else "") +
              (f"   max|diff| {diff:.2e}" if diff is not None else ""))
        rows.append({"case": title, "variant": name, "us": times[name],
                     "time_over_ours": speed, "max_abs_diff_vs_ours": diff})


# ---------------------------------------------------------------------------- GroupNorm + SiLU

def group_norm_case(runner, rng, shape, dtype, rows, rounds, per_round):
    n, c, h, w = shape
    g = 32
    x = rng.standard_normal(shape).astype(dtype) * 2 + 0.5
    gamma = (rng.standard_normal(c) * 0.5 + 1).astype(dtype)
    beta = rng.standard_normal(c).astype(dtype)
    ours = _model([helper.make_node("GroupNorm", ["X", "s", "b"], ["Y"], domain=opbridge.DOMAIN, num_groups=g,
                                    activation="silu")],
                  [_vi("X", dtype, list(shape))], [_vi("Y", dtype, None)], 17,
                  [_const("s", gamma), _const("b", beta)])
    # The plain export at opset 20 (torch.onnx.export, both exporters): InstanceNorm over G groups.
    plain = _model([
        helper.make_node("Reshape", ["X", "shape_g"], ["xg"]),
        helper.make_node("InstanceNormalization", ["xg", "ones", "zeros"], ["ng"], epsilon=1e-5),
        helper.make_node("Reshape", ["ng", "shape_x"], ["nx"]),
        helper.make_node("Mul", ["nx", "gamma"], ["m"]),
        helper.make_node("Add", ["m", "beta"], ["a"]),
        helper.make_node("Sigmoid", ["a"], ["sg"]),
        helper.make_node("Mul", ["a", "sg"], ["Y"]),
    ], [_vi("X", dtype, list(shape))], [_vi("Y", dtype, None)], 20, [
        _const("shape_g", np.array([n, g, -1], np.int64)), _const("shape_x", np.array(shape, np.int64)),
        _const("ones", np.ones(g, dtype)), _const("zeros", np.zeros(g, dtype)),
        _const("gamma", gamma.reshape(c, 1, 1)), _const("beta", beta.reshape(c, 1, 1))])
    gn21 = _model([
        helper.make_node("GroupNormalization", ["X", "s", "b"], ["a"], num_groups=g, epsilon=1e-5),
        helper.make_node("Sigmoid", ["a"], ["sg"]),
        helper.make_node("Mul", ["a", "sg"], ["Y"]),
    ], [_vi("X", dtype, list(shape))], [_vi("Y", dtype, None)], 21, [_const("s", gamma), _const("b", beta)])
    # ORT's contrib GroupNorm: NHWC in and out, gamma/beta float32 (fp16 models keep them float32).
    ms = _model([helper.make_node("GroupNorm", ["X", "gamma", "beta"], ["Y"], domain="com.microsoft", groups=g,
                                  activation=1, epsilon=1e-5, channels_last=1)],
                [_vi("X", dtype, [n, h, w, c])], [_vi("Y", dtype, None)], 17,
                [_const("gamma", gamma.astype(np.float32)), _const("beta", beta.astype(np.float32))], ms=True)
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    builders = {"opbridge GroupNorm(silu)": ours, "plain export (InstanceNorm chain)": plain,
                "GroupNormalization-21 + SiLU": gn21, "com.microsoft::GroupNorm (NHWC)": ms}
    feeds = {k: {"X": x} for k in builders}
    feeds["com.microsoft::GroupNorm (NHWC)"] = {"X": nhwc}
    title = f"GroupNorm+SiLU {shape} {np.dtype(dtype).name} ({x.nbytes / 2**20:.0f} MiB)"
    report(title, runner, builders, feeds, rounds, per_round, rows, "opbridge GroupNorm(silu)",
           post={"com.microsoft::GroupNorm (NHWC)": lambda y: y.transpose(0, 3, 1, 2)})


# ---------------------------------------------------------------------------- Inverse

def inverse_case(runner, rng, shape, rows, rounds, per_round):
    n = shape[-1]
    a = (rng.standard_normal(shape) + np.eye(n) * 2 * np.sqrt(n)).astype(np.float32)

    def one(domain, **attrs):
        return _model([helper.make_node("Inverse", ["X"], ["Y"], domain=domain, **attrs)],
                      [_vi("X", np.float32, list(shape))], [_vi("Y", np.float32, None)], 17, ms=True)

    builders = {"opbridge Inverse (raise)": one(opbridge.DOMAIN),
                "opbridge Inverse (nan)": one(opbridge.DOMAIN, on_singular="nan"),
                "com.microsoft::Inverse": one("com.microsoft")}
    report(f"Inverse {shape} float32", runner, builders, {k: {"X": a} for k in builders}, rounds, per_round, rows,
           "opbridge Inverse (raise)")


# ---------------------------------------------------------------------------- MSDA

COCO_LEVELS = [(100, 134), (50, 67), (25, 34), (13, 17)]  # 800x1066 input, strides 8..64


def msda_case(runner, rng, title, batch, queries, rows, rounds, per_round, heads=8, channels=32, points=4,
              levels=COCO_LEVELS):
    nl = len(levels)
    areas = [h * w for h, w in levels]
    s = sum(areas)
    lq = s if queries is None else queries
    f32 = np.float32
    value = rng.standard_normal((batch, s, heads, channels)).astype(f32)
    loc = rng.uniform(-0.05, 1.05, (batch, lq, heads, nl, points, 2)).astype(f32)
    attn = rng.uniform(0, 1, (batch, lq, heads, nl, points)).astype(f32)
    attn /= attn.sum(axis=(3, 4), keepdims=True)
    shapes = np.array(levels, np.int64)
    starts = np.concatenate([[0], np.cumsum(areas)[:-1]]).astype(np.int64)
    ins = [_vi("value", f32, list(value.shape)), _vi("loc", f32, list(loc.shape)), _vi("attn", f32, list(attn.shape))]
    ours = _model([helper.make_node("MultiScaleDeformableAttention", ["value", "shapes", "starts", "loc", "attn"],
                                    ["Y"], domain=opbridge.DOMAIN)], ins, [_vi("Y", f32, None)], 17,
                  [_const("shapes", shapes), _const("starts", starts)])
    nm = batch * heads
    nodes = [helper.make_node("Split", ["value", "splits"], [f"v{i}" for i in range(nl)], axis=1),
             helper.make_node("Mul", ["loc", "two"], ["loc2"]),
             helper.make_node("Sub", ["loc2", "one"], ["grid"])]
    inits = [_const("splits", np.array(areas, np.int64)), _const("two", np.array(2, f32)),
             _const("one", np.array(1, f32))]
    for i, (h, w) in enumerate(levels):
        inits += [_const(f"vs{i}a", np.array([batch, areas[i], heads * channels], np.int64)),
                  _const(f"vs{i}b", np.array([nm, channels, h, w], np.int64)), _const(f"lid{i}", np.array(i, np.int64))]
        nodes += [helper.make_node("Reshape", [f"v{i}", f"vs{i}a"], [f"va{i}"]),
                  helper.make_node("Transpose", [f"va{i}"], [f"vt{i}"], perm=[0, 2, 1]),
                  helper.make_node("Reshape", [f"vt{i}", f"vs{i}b"], [f"vl{i}"]),
                  helper.make_node("Gather", ["grid", f"lid{i}"], [f"g{i}"], axis=3),  # [N, Lq, M, P, 2]
                  helper.make_node("Transpose", [f"g{i}"], [f"gt{i}"], perm=[0, 2, 1, 3, 4]),
                  helper.make_node("Reshape", [f"gt{i}", "gshape"], [f"gl{i}"]),
                  helper.make_node("GridSample", [f"vl{i}", f"gl{i}"], [f"s{i}"], mode="bilinear",
                                   padding_mode="zeros", align_corners=0)]  # [N*M, D, Lq, P]
    inits += [_const("gshape", np.array([nm, lq, points, 2], np.int64)),
              _const("ashape", np.array([nm, 1, lq, nl * points], np.int64)),
              _const("oshape", np.array([batch, heads * channels, lq], np.int64)),
              _const("axes", np.array([-1], np.int64))]
    nodes += [helper.make_node("Concat", [f"s{i}" for i in range(nl)], ["cat"], axis=-1),
              helper.make_node("Transpose", ["attn"], ["at"], perm=[0, 2, 1, 3, 4]),
              helper.make_node("Reshape", ["at", "ashape"], ["al"]),
              helper.make_node("Mul", ["cat", "al"], ["wv"]),
              helper.make_node("ReduceSum", ["wv", "axes"], ["red"], keepdims=0),
              helper.make_node("Reshape", ["red", "oshape"], ["ro"]),
              helper.make_node("Transpose", ["ro"], ["Y"], perm=[0, 2, 1])]
    chain = _model(nodes, ins, [_vi("Y", f32, None)], 17, inits)
    builders = {"opbridge MultiScaleDeformableAttention": ours, "plain export (GridSample chain)": chain}
    feeds = {"value": value, "loc": loc, "attn": attn}
    report(f"MSDA {title}: batch {batch}, {lq} queries, {s} values", runner, builders,
           {k: feeds for k in builders}, rounds, per_round, rows, "opbridge MultiScaleDeformableAttention")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="one shape per op, few rounds")
    args = ap.parse_args(argv)
    import onnxruntime as ort

    runner = Runner(args.provider)
    rng = np.random.default_rng(0)
    rows: list = []
    rounds, per_round = (3, 2) if args.quick else (7, 10)
    print(f"onnxruntime {ort.__version__} ({ort.__file__}), provider {args.provider}, onnx {onnx.__version__}")
    gn_shapes = [(2, 320, 64, 64)] if args.quick else [(2, 320, 64, 64), (2, 1280, 16, 16), (1, 512, 128, 128),
                                                       (1, 128, 512, 512)]
    for shape in gn_shapes:
        for dtype in (np.float32, np.float16):
            group_norm_case(runner, rng, shape, dtype, rows, rounds, per_round)
    for shape in [(1024, 8, 8)] if args.quick else [(4096, 3, 3), (1024, 8, 8), (64, 64, 64), (8, 256, 256),
                                                     (2, 512, 512)]:
        inverse_case(runner, rng, shape, rows, rounds, per_round)
    if args.quick:
        msda_case(runner, rng, "decoder (small levels)", 2, 30, rows, rounds, per_round,
                  levels=[(20, 26), (10, 13), (5, 7), (3, 4)])
    else:
        msda_case(runner, rng, "encoder", 1, None, rows, rounds, per_round)
        msda_case(runner, rng, "decoder", 2, 300, rows, rounds, per_round)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"onnxruntime": ort.__version__, "provider": args.provider, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
