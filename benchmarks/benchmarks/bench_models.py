"""Model-level CPU benchmarks: diffusers' AutoencoderKL decoder and UNet2DModel (small configs,
random init), torch eager as is vs after ``opbridge.nn.convert`` (GroupNorm swapped, SiLU fused
where convert can see it, channels-last kept). Needs the optional ``models`` extra (diffusers);
skipped with a reason where it is missing."""

from __future__ import annotations

import copy

from ._common import THREADS, measure_speedup, torch_or_skip

MODELS = ["vae_decoder", "unet2d"]
LAYOUTS = ["contiguous", "channels_last"]


def build(kind, layout, seed=0):
    """(model, inputs) for `kind`, random weights; NotImplementedError where diffusers is missing."""
    torch = torch_or_skip()
    try:
        import diffusers
    except ImportError as e:
        raise NotImplementedError("diffusers is not installed (pip install 'opbridge[models]')") from e
    torch.manual_seed(seed)
    if kind == "vae_decoder":
        # A small SD-style VAE: 4 resolution levels, 128-512 channels, 32 groups.
        vae = diffusers.AutoencoderKL(block_out_channels=(64, 128, 256, 256), layers_per_block=1,
                                      latent_channels=4, norm_num_groups=32,
                                      down_block_types=("DownEncoderBlock2D",) * 4,
                                      up_block_types=("UpDecoderBlock2D",) * 4)
        model = vae.decoder.eval()
        args = (torch.randn(1, 4, 32, 32),)
    else:
        model = diffusers.UNet2DModel(sample_size=64, in_channels=3, out_channels=3, layers_per_block=1,
                                      block_out_channels=(64, 128, 256), norm_num_groups=32,
                                      down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D"),
                                      up_block_types=("AttnUpBlock2D", "UpBlock2D", "UpBlock2D")).eval()
        args = (torch.randn(1, 3, 64, 64), torch.tensor([10]))
    if layout == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        args = tuple(a.contiguous(memory_format=torch.channels_last) if a.dim() == 4 else a for a in args)
    return model, args


def native_and_converted(kind, layout, train=False):
    """(native model, opbridge.nn.convert of a copy, inputs), torch at THREADS threads; train:
    both in training mode (convert sees the mode the model has)."""
    torch = torch_or_skip()
    import opbridge.nn

    native, args = build(kind, layout)
    native.train(train)
    converted = opbridge.nn.convert(copy.deepcopy(native))
    torch.set_num_threads(THREADS)
    return native, converted, args


class ModelConvertSpeedup:
    """time(native torch eager) / time(after opbridge.nn.convert), THREADS threads, float32,
    side by side in one process: > 1 means the converted model is faster (goal: never < 1)."""

    params = (MODELS, LAYOUTS)
    param_names = ["model", "layout"]
    unit = "x"
    timeout = 600

    def setup(self, kind, layout):
        torch = torch_or_skip()
        native, converted, args = native_and_converted(kind, layout)

        def run(m):
            def fn():
                with torch.inference_mode():
                    m(*args)
            return fn

        self.native, self.converted = run(native), run(converted)

    def track_speedup(self, kind, layout):
        return measure_speedup(self.converted, self.native, rounds=7, round_seconds=0.2)


class ModelConvertTrainingSpeedup:
    """One training step (forward, then backward of a mean-square loss into every parameter and
    the input): time(native torch eager) / time(after opbridge.nn.convert), THREADS threads,
    float32; > 1 means the converted model trains faster (goal: never < 1)."""

    params = (MODELS, LAYOUTS)
    param_names = ["model", "layout"]
    unit = "x"
    timeout = 900

    def setup(self, kind, layout):
        native, converted, args = native_and_converted(kind, layout, train=True)
        x = args[0].clone().requires_grad_()
        rest = args[1:]

        def step(m):
            def fn():
                m.zero_grad(set_to_none=True)
                x.grad = None
                out = m(x, *rest)
                out = out.sample if hasattr(out, "sample") else out
                out.square().mean().backward()
            return fn

        self.native, self.converted = step(native), step(converted)

    def track_speedup(self, kind, layout):
        return measure_speedup(self.converted, self.native, rounds=5, round_seconds=0.3)
