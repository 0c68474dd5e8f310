"""A real model in ONNX Runtime: diffusers' AutoencoderKL decoder (small config, random init)
exported plainly with torch.onnx.export against opbridge's export (GroupNorm as
ai.opbridge::GroupNorm, with and without SiLU fused into it).

Needs the `models` extra (diffusers); skipped with a reason where it is missing. Every model's
output is compared with torch before it is timed: a variant that computes something else (e.g. the
SiLU-fused one with an ORT library that does not apply GroupNorm's activation) is skipped, not timed.
"""

from __future__ import annotations

import numpy as np

from ._common import measure_speedup, ort_runner, ort_session, ort_value, torch_or_skip

# A small AutoencoderKL: three resolution levels, 64-128-128 channels, 2 ResNet blocks per level
# (2 + 1 in the decoder), 32 groups as in Stable Diffusion's VAE; a 4x32x32 latent decodes to a
# 3x128x128 image. 24 GroupNorms, 23 of them followed by SiLU.
VAE_CONFIG = dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(64, 128, 128),
                  down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
                  layers_per_block=2, norm_num_groups=32)
LATENT = (1, 4, 32, 32)
VARIANTS = ["torch.onnx.export", "opbridge GroupNorm", "opbridge GroupNorm+SiLU"]
# Max |ORT - torch| / max(1, max |torch|) accepted before timing a variant.
AGREEMENT = 1e-3


def _decoder():
    torch = torch_or_skip()
    try:
        from diffusers import AutoencoderKL
    except ImportError as e:
        raise NotImplementedError("diffusers is not installed (pip install 'opbridge[models]')") from e
    torch.manual_seed(0)
    vae = AutoencoderKL(**VAE_CONFIG).eval()

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.vae = vae

        def forward(self, z):
            return self.vae.decode(z, return_dict=False)[0]

    return Decoder().eval()


def _models():
    """variant -> (ModelProto, needs opbridge's library), the latent, and torch's output."""
    import logging
    import warnings

    torch = torch_or_skip()
    import onnx_ir as ir

    import opbridge.onnx
    from opbridge.onnx._rewrite import rewrite_model

    dec = _decoder()
    z = torch.from_numpy(np.random.default_rng(0).standard_normal(LATENT).astype(np.float32))
    with torch.no_grad():
        expected = dec(z).numpy()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = torch.onnx.export(dec, (z,), dynamo=True, verbose=False).model_proto
        fused = opbridge.onnx.export(dec, (z,), dynamic_batch=False)
    gn_only = ir.serde.deserialize_model(plain)
    rewrite_model(gn_only, silu=False)
    models = {
        "torch.onnx.export": (plain, False),
        "opbridge GroupNorm": (ir.serde.serialize_model(gn_only), True),
        "opbridge GroupNorm+SiLU": (fused, True),
    }
    return models, z.numpy(), expected


_CACHE: dict = {}


def _runner(variant):
    """A no-argument callable running one decode of `variant` in ORT (built once per process),
    or NotImplementedError (asv: skipped) when that variant does not compute the model."""
    if "models" not in _CACHE:
        _CACHE["models"] = _models()
    models, z, expected = _CACHE["models"]
    if variant not in _CACHE:
        proto, custom = models[variant]
        sess = ort_session(proto, custom_ops=custom)
        name = sess.get_inputs()[0].name
        got = sess.run(None, {name: z})[0]
        err = float(np.max(np.abs(got - expected))) / max(1.0, float(np.max(np.abs(expected))))
        if not err <= AGREEMENT:
            _CACHE[variant] = NotImplementedError(
                f"{variant}: ORT output differs from torch (normalized max error {err:.3g}); "
                "for the SiLU-fused variant, opbridge's ORT library does not apply GroupNorm's activation yet")
        else:
            _CACHE[variant] = (sess, ort_runner(sess, {name: ort_value(z, "float32")}))
    entry = _CACHE[variant]
    if isinstance(entry, Exception):
        raise entry
    return entry[1]


class VaeDecoderOrt:
    """Seconds per decode of the VAE decoder in ONNX Runtime (CPU, THREADS intra-op threads)."""

    params = (VARIANTS,)
    param_names = ["variant"]
    timeout = 600

    def setup(self, variant):
        self.fn = _runner(variant)
        self.fn()

    def time_decode(self, variant):
        self.fn()


class VaeDecoderOrtSpeedup:
    """time(plain torch.onnx.export model) / time(opbridge's), side by side in one process."""

    params = (VARIANTS[1:],)
    param_names = ["variant"]
    timeout = 600

    def setup(self, variant):
        self.ours = _runner(variant)
        self.theirs = _runner(VARIANTS[0])

    def track_speedup(self, variant):
        return measure_speedup(self.ours, self.theirs, rounds=7, round_seconds=0.3)

    track_speedup.unit = "x"
