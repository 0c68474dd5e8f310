"""Real-size models for memory and time measurements of export and optimize, and the child
process that exports them (bench_large_models.py and tests/export/test_large_models.py run it).

``matmuls`` (``build``): N_PARAMS distinct torch.randn weights (d x d, together about GB
gigabytes), each a MatMul of a (batch, d) activation followed by Tanh, and BLOCKS GroupNorm(8, 32)
+ SiLU blocks on a (batch, 32, 1, d / 32) view in between (what opbridge's fusion rewrites). The
weights dominate its memory; its compute is small (batch x d x d per weight), so that times measure
the files and the tensors, not arithmetic.

One model per way a forward can use a large tensor (``build_kind``; KINDS), each about GB of it
around the same small GroupNorm + SiLU and F.group_norm pair: used whole by a Conv2d (followed by
a GroupNorm of its channels) or a Linear; a 1-D parameter sliced (``p[:4]``); an N-D one sliced
(rows); a 1-D one gathered (``p[ids]``, ids a model input); one viewed (``p.view(-1, 128)[:4]``);
one Linear weight shared by two layers (tied); a registered buffer (sliced and reduced whole); a
plain tensor attribute that torch.export lifts into the graph as a constant and the exporter folds
(``(c * 2)[:4]``). ``mixed`` has all of them at once, GB shared among them. ``unet_sd15``: diffusers'
UNet2DConditionModel at Stable Diffusion 1.5's configuration (3.44 GB of float32), random init.

As a program: ``python _large_model.py export --model sliced_1d --gb 2.2 --variant opbridge
--dynamo 1 --out m.onnx`` builds the model and exports it with ``torch.onnx.export`` (``--variant
torch``) or ``opbridge.onnx.export`` after ``opbridge.nn.convert`` (``--variant opbridge``; the
matmuls model is not converted: the export's fusion rewrites its GroupNorms) and prints one JSON
line: the wall time of the export call. ``--reference DIR`` also writes the example inputs
(``inputs.npz``; the first also as ``x.npy``) and torch's output for them (``y.npy``) there, before
the export. Peak memory is measured by the parent (``run_measured``: ru_maxrss of the child from
wait4), so that the child's own bookkeeping adds nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time

N_PARAMS = 64
BLOCKS = 2
KINDS = ("conv", "linear", "sliced_1d", "sliced_nd", "gathered", "viewed", "tied", "buffer", "folded")
MODELS = ("matmuls", *KINDS, "mixed", "unet_sd15", "deformable_detr")
CHANNELS, GROUPS = 32, 8
SEED = 0


def dims_for(gb: float, n_params: int = N_PARAMS, itemsize: int = 4) -> int:
    """The side d of each square weight for a model of about ``gb`` (1e9 bytes), a multiple of
    CHANNELS (the GroupNorm view needs it)."""
    return int(math.sqrt(gb * 1e9 / n_params / itemsize)) // CHANNELS * CHANNELS


def build(gb: float, dtype: str = "float32", n_params: int = N_PARAMS, blocks: int = BLOCKS, seed: int = SEED):
    """(model in eval mode, (example input,)); the same weights for the same arguments."""
    import torch

    dt = getattr(torch, dtype)
    d = dims_for(gb, n_params, torch.empty((), dtype=dt).element_size())
    every = max(1, n_params // (blocks + 1))

    class Large(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            gen = torch.Generator().manual_seed(seed)
            self.weights = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.randn(d, d, generator=gen, dtype=dt)) for _ in range(n_params)])
            self.norms = torch.nn.ModuleList([torch.nn.GroupNorm(GROUPS, CHANNELS, dtype=dt) for _ in range(blocks)])
            with torch.no_grad():  # not the identity affine, so that a wrong scale or bias shows
                for gn in self.norms:
                    gn.weight.copy_(torch.rand(CHANNELS, generator=gen) + 0.5)
                    gn.bias.copy_(torch.rand(CHANNELS, generator=gen) - 0.5)

        def forward(self, x):
            h, k = x, 0
            for i, w in enumerate(self.weights):
                h = (h @ w) * (1.0 / math.sqrt(d))
                if (i + 1) % every == 0 and k < len(self.norms):
                    n = h.shape[0]
                    # Tanh on the 4-D view, so that the GroupNorm's input is a value of its own
                    # (the exporters fold a Reshape straight into GroupNorm's grouping Reshape).
                    v = torch.tanh(h.reshape(n, CHANNELS, 1, d // CHANNELS))
                    h = torch.nn.functional.silu(self.norms[k](v)).reshape(n, d)
                    k += 1
                else:
                    h = torch.tanh(h)
            return h

    gen = torch.Generator().manual_seed(seed + 1)
    return Large().eval(), (torch.randn(2, d, generator=gen, dtype=dt),)


def _kind_parts(kind: str, nbytes: int, gen):
    """(modules, make term) for one kind of large tensor of about ``nbytes`` float32 bytes: the
    term maps (x4, ids) to a scalar or a (batch,) vector, x4 the (batch, 32, 8, 8) input."""
    import torch
    import torch.nn.functional as F

    n = max(1024, nbytes // 4 // 1024 * 1024)  # elements; a multiple of 128 (the viewed kind)
    mods = torch.nn.Module()

    def wide(x4, width):
        """A (batch, width) activation made from x4 (repeated), for the Linear kinds."""
        reps = -(-width // (CHANNELS * 64))  # from constants: the TorchScript exporter traces shapes
        return x4.flatten(1).repeat(1, reps)[:, :width]

    if kind == "conv":
        c = max(32, int(math.sqrt(nbytes / 4 / 9)) // 32 * 32)
        mods.conv = torch.nn.Conv2d(c, c, 3, padding=1)
        mods.norm = torch.nn.GroupNorm(8, c)
        return mods, lambda m, x4, ids: F.silu(m.norm(m.conv(wide(x4, c * 16).reshape(-1, c, 4, 4)))).mean((1, 2, 3))
    if kind in ("linear", "tied"):
        d = max(32, int(math.sqrt(nbytes / 4)) // 32 * 32)
        if kind == "linear":
            mods.lin = torch.nn.Linear(d, d)
            torch.nn.init.normal_(mods.lin.weight, std=d ** -0.5, generator=gen)
            return mods, lambda m, x4, ids: m.lin(wide(x4, d)).mean(1)
        mods.a = torch.nn.Linear(d, d, bias=False)
        mods.b = torch.nn.Linear(d, d, bias=False)
        torch.nn.init.normal_(mods.a.weight, std=d ** -0.5, generator=gen)
        mods.b.weight = mods.a.weight  # tied: one tensor, two layers
        return mods, lambda m, x4, ids: m.b(torch.tanh(m.a(wide(x4, d)))).mean(1)
    if kind == "sliced_1d":
        mods.p = torch.nn.Parameter(torch.randn(n, generator=gen))
        return mods, lambda m, x4, ids: m.p[:4].sum()
    if kind == "sliced_nd":
        mods.p = torch.nn.Parameter(torch.randn(n // 128, 128, generator=gen))
        return mods, lambda m, x4, ids: m.p[:4].sum()
    if kind == "gathered":
        mods.p = torch.nn.Parameter(torch.randn(n, generator=gen))
        return mods, lambda m, x4, ids: m.p[ids].sum()
    if kind == "viewed":
        mods.p = torch.nn.Parameter(torch.randn(n, generator=gen))
        return mods, lambda m, x4, ids: m.p.view(-1, 128)[:4].sum()
    if kind == "buffer":
        mods.register_buffer("table", torch.randn(n, generator=gen))
        return mods, lambda m, x4, ids: m.table[:4].sum() + m.table.mean()
    if kind == "folded":
        # A plain attribute, neither parameter nor buffer: torch.export lifts it as a constant.
        mods.const = torch.randn(n, generator=gen)
        return mods, lambda m, x4, ids: (m.const * 2)[:4].sum()
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def build_kind(kind: str, gb: float, seed: int = SEED):
    """(model in eval mode, (x, ids)) for one of KINDS, or "mixed" (all of them, GB in all)."""
    import torch
    import torch.nn.functional as F

    kinds = KINDS if kind == "mixed" else (kind,)
    gen = torch.Generator().manual_seed(seed)

    class Kinds(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.parts = torch.nn.ModuleList()
            self.terms = []
            for k in kinds:
                mods, term = _kind_parts(k, int(gb * 1e9 / len(kinds)), gen)
                self.parts.append(mods)
                self.terms.append(term)
            self.norm = torch.nn.GroupNorm(GROUPS, CHANNELS)
            self.gn_weight = torch.nn.Parameter(torch.rand(CHANNELS, generator=gen) + 0.5)
            self.gn_bias = torch.nn.Parameter(torch.rand(CHANNELS, generator=gen) - 0.5)

        def forward(self, x, ids):
            # nn.GroupNorm + SiLU: opbridge.nn.convert makes it one node; F.group_norm: the
            # export's fusion rewrites it.
            y = F.group_norm(F.silu(self.norm(x)), GROUPS, self.gn_weight, self.gn_bias)
            t = sum(term(m, x, ids) for m, term in zip(self.parts, self.terms))
            return y * (1.0 + 0.1 * torch.tanh(t)).reshape(-1, 1, 1, 1)

    model = Kinds().eval()
    g2 = torch.Generator().manual_seed(seed + 1)
    return model, (torch.randn(2, CHANNELS, 8, 8, generator=g2), torch.tensor([0, 5, 9], dtype=torch.int64))


# Stable Diffusion 1.5's UNet (runwayml/stable-diffusion-v1-5, unet/config.json): 859.5 M parameters.
SD15_UNET = dict(sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
                 block_out_channels=(320, 640, 1280, 1280), down_block_types=(
                     "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
                 cross_attention_dim=768, attention_head_dim=8, norm_num_groups=32)


def build_unet(seed: int = SEED, latent: int = 32):
    """(UNet2DConditionModel of SD15_UNET, random init, returning its sample; (sample, timestep,
    encoder_hidden_states)) at batch 2 and a latent of ``latent`` x ``latent``."""
    import diffusers
    import torch

    torch.manual_seed(seed)
    unet = diffusers.UNet2DConditionModel(**SD15_UNET)

    class Unet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unet = unet

        def forward(self, sample, timestep, encoder_hidden_states):
            return self.unet(sample, timestep, encoder_hidden_states, return_dict=False)[0]

    g = torch.Generator().manual_seed(seed + 1)
    inputs = (torch.randn(2, 4, latent, latent, generator=g), torch.tensor([500, 500], dtype=torch.int64),
              torch.randn(2, 77, 768, generator=g))
    return Unet().eval(), inputs


def build_deformable_detr(gb: float, seed: int = SEED):
    """transformers' DeformableDetrForObjectDetection (random init) with feed-forward layers wide
    enough for about ``gb`` of weights (d_model 256, 2 encoder + 2 decoder layers, 8 heads, 4 levels,
    4 points: 4 deformable-attention modules), returning logits and boxes in one tensor; (image,)
    of 1x3x96x128. Real-size in bytes, small in compute: 256 encoder positions, 10 queries."""
    import torch
    import transformers

    d_model, layers = 256, 4
    ffn = max(1024, int(gb * 1e9 / (layers * 2 * d_model * 4)) // 1024 * 1024)
    backbone = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1],
                                         layer_type="basic", out_features=["stage2", "stage3", "stage4"])
    cfg = transformers.DeformableDetrConfig(
        backbone_config=backbone, use_timm_backbone=False, use_pretrained_backbone=False, d_model=d_model,
        encoder_layers=layers // 2, decoder_layers=layers // 2, encoder_attention_heads=8, decoder_attention_heads=8,
        encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, num_queries=10, num_feature_levels=4, encoder_n_points=4,
        decoder_n_points=4, num_labels=3)
    torch.manual_seed(seed)
    detr = transformers.DeformableDetrForObjectDetection(cfg).eval()

    class Detector(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.detr = detr

        def forward(self, pixel_values):
            out = self.detr(pixel_values=pixel_values)
            return torch.cat([out.logits, out.pred_boxes], dim=-1)

    g = torch.Generator().manual_seed(seed + 1)
    return Detector().eval(), (torch.randn(1, 3, 96, 128, generator=g),)


def build_model(model: str, gb: float, dtype: str = "float32"):
    """Any of MODELS: (model, inputs). ``gb`` is ignored for unet_sd15 (its size is its own)."""
    if model == "matmuls":
        return build(gb, dtype)
    if dtype != "float32":
        raise ValueError(f"{model}: float32 only, got {dtype}")
    if model == "deformable_detr":
        return build_deformable_detr(gb)
    return build_unet() if model == "unet_sd15" else build_kind(model, gb)


def state_bytes(model) -> int:
    """G: the bytes of a module's parameters and buffers (each storage once) and of the plain tensor
    attributes that export lifts into the graph (the folded kind's)."""
    import torch

    seen, total = set(), 0
    tensors = list(model.parameters()) + list(model.buffers())
    tensors += [v for m in model.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)]
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def tensor_bytes(gb: float, dtype: str = "float32", n_params: int = N_PARAMS) -> int:
    """G: the bytes of the model's tensors (the weights; the GroupNorms add 256 bytes each)."""
    itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    d = dims_for(gb, n_params, itemsize)
    return n_params * d * d * itemsize + BLOCKS * 2 * CHANNELS * itemsize


def _export(args: argparse.Namespace) -> None:
    import torch

    model, inputs = build_model(args.model, args.gb, args.dtype)
    if args.reference:
        import numpy as np

        with torch.no_grad():
            y = model(*inputs)
        as_np = (lambda t: t.float().numpy()) if args.dtype == "bfloat16" else (lambda t: t.numpy())
        np.savez(os.path.join(args.reference, "inputs.npz"), *[as_np(t) for t in inputs])
        np.save(os.path.join(args.reference, "x.npy"), as_np(inputs[0]))
        np.save(os.path.join(args.reference, "y.npy"), as_np(y))
    if args.model == "deformable_detr" and args.dynamo:
        # transformers' torch._check calls become aten._is_all_true, which the dynamo exporter
        # cannot export; transformers' own switch turns them off (read at call time).
        os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = "1"
    start = time.perf_counter()
    if args.variant == "torch":
        torch.onnx.export(model, inputs, args.out, dynamo=bool(args.dynamo))
    else:
        import opbridge.nn
        import opbridge.onnx

        if args.model != "matmuls":
            opbridge.nn.convert(model)
        opbridge.onnx.export(model, inputs, args.out, dynamo=bool(args.dynamo), fuse=bool(args.fuse))
    print(json.dumps({"export_s": time.perf_counter() - start, "state_bytes": state_bytes(model)}))


@dataclasses.dataclass
class Measured:
    returncode: int
    peak_bytes: int  # ru_maxrss of the child (wait4)
    wall_s: float  # of the whole child, start-up included
    stdout: str
    stderr: str

    def json(self) -> dict:
        """The last line of stdout as JSON (what the export child prints)."""
        return json.loads(self.stdout.strip().splitlines()[-1])


def run_measured(argv: list[str], env: dict | None = None, timeout: float | None = None) -> Measured:
    """Runs ``argv`` as a child process; its exit status, peak RSS and wall time.

    The peak is the child's ru_maxrss from wait4, taken by a small launcher process (this file's
    ``spawn`` command) rather than by the caller: Linux counts the memory of the process that
    exec'd a program into that program's ru_maxrss (with vfork, the parent's own peak), so a
    large caller (a test process that has run ONNX Runtime) would inflate it."""
    with tempfile.TemporaryDirectory() as scratch:
        report = os.path.join(scratch, "rusage.json")
        out_path, err_path = os.path.join(scratch, "out"), os.path.join(scratch, "err")
        launcher = [sys.executable, os.path.abspath(__file__), "spawn", report, "--", *argv]
        start = time.perf_counter()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(launcher, stdout=out, stderr=err, env=env, start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        wall = time.perf_counter() - start
        with open(out_path, "rb") as f:
            stdout = f.read().decode(errors="replace")
        with open(err_path, "rb") as f:
            stderr = f.read().decode(errors="replace")
        if not os.path.exists(report):
            return Measured(returncode=proc.returncode or -9, peak_bytes=0, wall_s=wall, stdout=stdout,
                            stderr=stderr + f"\n(no report from the launcher; exit status {proc.returncode})")
        with open(report) as f:
            usage = json.load(f)
        return Measured(returncode=usage["returncode"], peak_bytes=usage["maxrss_kib"] * 1024, wall_s=wall,
                        stdout=stdout, stderr=stderr)


def _spawn(report: str, argv: list[str]) -> int:
    """Runs argv and writes its exit status and ru_maxrss (KiB, Linux) to ``report``."""
    proc = subprocess.Popen(argv)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here
    with open(report, "w") as f:
        json.dump({"returncode": proc.returncode, "maxrss_kib": usage.ru_maxrss}, f)
    return 0


def export_argv(gb: float, variant: str, dynamo: bool, out: str, *, fuse: bool = True, dtype: str = "float32",
                reference: str | None = None, model: str = "matmuls") -> list[str]:
    argv = [sys.executable, os.path.abspath(__file__), "export", "--model", model, "--gb", str(gb), "--variant", variant,
            "--dynamo", str(int(dynamo)), "--fuse", str(int(fuse)), "--dtype", dtype, "--out", out]
    return argv + (["--reference", reference] if reference else [])


def optimize_argv(src: str, dst: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "opbridge", "optimize", src, dst, *extra]


def child_env() -> dict:
    """The environment of a measured child: as this process's, with malloc returning large blocks
    to the system as soon as they are freed (glibc's default; a parent's MALLOC_* settings for
    timing benchmarks would keep freed memory in the child's RSS)."""
    env = dict(os.environ)
    for key in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        env.pop(key, None)
    return env


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["spawn"]:
        return _spawn(argv[1], argv[3:])  # spawn REPORT -- COMMAND...
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--model", choices=MODELS, default="matmuls")
    e.add_argument("--gb", type=float, required=True)
    e.add_argument("--variant", choices=["torch", "opbridge"], required=True)
    e.add_argument("--dynamo", type=int, default=1)
    e.add_argument("--fuse", type=int, default=1)
    e.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    e.add_argument("--out", required=True)
    e.add_argument("--reference", default=None)
    args = p.parse_args(argv)
    _export(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
