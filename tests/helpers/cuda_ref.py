"""float64 references for the CUDA tests (tests/cuda_ops/test_cuda.py, tests/cuda_ops/test_cuda_host.py), written
from the ops' definitions, independent of the kernels:

* MultiScaleDeformableAttention as Deformable-DETR's ``ms_deform_attn_core_pytorch`` computes it
  (torch.nn.functional.grid_sample, bilinear, zero padding, align_corners=False, of the grid
  2 * location - 1), differentiable, so torch.autograd gives the reference gradients. A NaN or
  infinite location contributes 0 (the op's definition): it is moved far outside the map first.
* GroupNorm on channels_last data and with SiLU, through tests/helpers/reference.py's GroupNorm.
"""

from __future__ import annotations

import numpy as np

from helpers import reference as ref


def ms_deform_attn(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    """value (N, S, M, D), spatial_shapes (L, 2), level_start_index (L,), sampling_locations
    (N, Lq, M, L, P, 2), attention_weights (N, Lq, M, L, P) -> (N, Lq, M * D); torch float64
    tensors (gradients flow through value, sampling_locations and attention_weights)."""
    import torch
    import torch.nn.functional as F

    n, s, m, d = value.shape
    _, lq, _, levels, points, _ = sampling_locations.shape
    finite = torch.isfinite(sampling_locations).all(dim=-1, keepdim=True)
    # Far outside every map: zero padding makes such a sample (and its gradients) exactly 0.
    loc = torch.where(finite, sampling_locations, torch.full_like(sampling_locations, 16.0))
    grids = 2 * loc - 1
    samples = []
    for lvl in range(levels):
        h, w = int(spatial_shapes[lvl, 0]), int(spatial_shapes[lvl, 1])
        start = int(level_start_index[lvl])
        v = value[:, start : start + h * w].flatten(2).transpose(1, 2).reshape(n * m, d, h, w)
        g = grids[:, :, :, lvl].transpose(1, 2).flatten(0, 1)  # (N * M, Lq, P, 2)
        samples.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros", align_corners=False))
    a = attention_weights.transpose(1, 2).reshape(n * m, 1, lq, levels * points)
    out = (torch.stack(samples, dim=-2).flatten(-2) * a).sum(-1).view(n, m * d, lq)
    return out.transpose(1, 2).contiguous()


def ms_deform_attn_with_grads(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                              grad_output):
    """numpy float64 in, (output, grad_value, grad_sampling_locations, grad_attention_weights) out."""
    import torch

    t = [torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)
         for a in (value, sampling_locations, attention_weights)]
    out = ms_deform_attn(t[0], spatial_shapes, level_start_index, t[1], t[2])
    out.backward(torch.tensor(np.asarray(grad_output, dtype=np.float64)))
    return (out.detach().numpy(),) + tuple(x.grad.numpy() for x in t)


def silu(x):
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def group_norm_any(x, num_groups, weight=None, bias=None, eps=1e-5, activation="none", channels_last=False):
    """GroupNorm of x (N, C, *) or, with channels_last, of x (N, *, C) (returned in that layout),
    followed by the activation ("none" | "silu")."""
    x = np.asarray(x, dtype=np.float64)
    if channels_last:
        x = np.moveaxis(x, -1, 1)
    y = ref.group_norm(x, num_groups, weight, bias, eps)
    if activation == "silu":
        y = silu(y)
    return np.moveaxis(y, 1, -1) if channels_last else y


def ms_deform_attn_locations(rng, n, lq, m, levels, p, lo=-0.3, hi=1.3, margin=0.01):
    """Random sampling locations (N, Lq, M, L, P, 2) in [lo, hi] (so some lie partly or wholly
    outside the maps) whose pixel coordinates (x W - 0.5, y H - 0.5) stay `margin` away from
    integers. Bilinear sampling is continuous there but its derivative along an axis jumps at
    integer pixel coordinates, and a float32 kernel rounds x W differently from a float64
    reference: a location within rounding distance of an integer would get the other one-sided
    derivative."""
    loc = np.empty((n, lq, m, len(levels), p, 2))
    for lvl, (h, w) in enumerate(levels):
        for axis, size in ((0, w), (1, h)):
            px = rng.uniform(lo * size - 0.5, hi * size - 0.5, (n, lq, m, p))
            base = np.floor(px)
            px = base + margin + (1 - 2 * margin) * (px - base)
            loc[:, :, :, lvl, :, axis] = (px + 0.5) / size
    return loc
