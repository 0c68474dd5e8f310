// MultiScaleDeformableAttention: the per-thread index and bilinear math of the CUDA kernels
// (ms_deform_attn_kernel.cu). Host-device code without CUDA-only calls, so tests/cuda_ops/cuda_host/
// compiles it with the host compiler and checks it against a float64 reference on machines
// without a GPU. The including file declares, before including this header:
//   to_acc(D) -> A                          element -> accumulation type
//   template <int VEC, class GV, class A> void atomic_add_vec(GV* p, const A* v)
//                                           p[i] += v[i] for i < VEC (atomically on the device)
//
// Work decomposition (both kernels): r = (n * Lq + q) * M + m indexes one query of one head;
// D is covered by DV = D / VEC vectors of VEC elements.
//   forward   one thread per (r, vector): sums its VEC outputs over the L * P samples.
//   backward  G lanes (a power of two <= 32) per r; lane i takes vectors i, i + G, ... . Per
//             sample, each lane adds its share of grad_value (atomics) and of the three dot
//             products over D that give grad_attention_weights and grad_sampling_locations; the
//             kernel sums those over the G lanes (warp shuffles) and lane 0 writes them.
#pragma once

#include <math.h>

#include <cstdint>

#ifndef OPBRIDGE_HD
#if defined(__CUDACC__)
#define OPBRIDGE_HD __host__ __device__ __forceinline__
#else
#define OPBRIDGE_HD inline
#endif
#endif

namespace opbridge::cuda::msda {

inline constexpr int kMaxLevels = 16;

// The level table, passed by value in the kernel arguments (no device copy, no sync).
struct Levels {
  int32_t h[kMaxLevels];
  int32_t w[kMaxLevels];
  int64_t start[kMaxLevels];
};

// Sizes as the kernels use them; DV = D / VEC.
struct Shape {
  int64_t N, S, M, D, Lq, L, P, DV;
};

// VEC elements loaded or stored as one access (the launcher guarantees the alignment).
template <class D, int VEC>
struct alignas(sizeof(D) * VEC) Vec {
  D v[VEC];
};

OPBRIDGE_HD float floor_acc(float v) { return floorf(v); }
OPBRIDGE_HD double floor_acc(double v) { return floor(v); }

// One bilinear sample: the element offsets (spatial index * M * D) of its four taps, -1 for a
// tap outside the map, and the fractional position.
//   t00 = (y0, x0), t01 = (y0, x0 + 1), t10 = (y0 + 1, x0), t11 = (y0 + 1, x0 + 1)
template <class A>
struct Sample {
  int64_t t00, t01, t10, t11;
  A fx, fy, hx, hy;  // hx = 1 - fx, hy = 1 - fy
};

// Sets up the sample of a level of H x W (first spatial index `start`) at normalized (lx, ly);
// returns false when it contributes nothing: NaN or infinite coordinates, or every tap outside
// (pixel x < -1 or >= W, likewise y). Pixel x == -1 is kept, as grid_sample keeps it: its only
// tap inside has weight 0, but its derivative along x (taps at floor(x) and floor(x) + 1, as at
// every point) is not 0.
//   row: elements between consecutive spatial positions of value (M * D)
template <class A>
OPBRIDGE_HD bool setup_sample(A lx, A ly, int H, int W, int64_t start, int64_t row, Sample<A>* s) {
  const A x = lx * static_cast<A>(W) - A(0.5);
  const A y = ly * static_cast<A>(H) - A(0.5);
  if (!(x >= A(-1) && y >= A(-1) && x < static_cast<A>(W) && y < static_cast<A>(H))) return false;
  const A xf = floor_acc(x), yf = floor_acc(y);
  // -1 <= x0 <= W - 1 (x < W in the coordinate type, so floor(x) < W) and likewise y0.
  const int x0 = static_cast<int>(xf), y0 = static_cast<int>(yf);
  const int x1 = x0 + 1, y1 = y0 + 1;
  s->fx = x - xf;
  s->fy = y - yf;
  s->hx = A(1) - s->fx;
  s->hy = A(1) - s->fy;
  const bool in_x0 = x0 >= 0 && x0 < W, in_x1 = x1 >= 0 && x1 < W;
  const bool in_y0 = y0 >= 0 && y0 < H, in_y1 = y1 >= 0 && y1 < H;
  const int64_t r0 = start + static_cast<int64_t>(y0) * W;  // spatial index of (y0, 0)
  const int64_t r1 = r0 + W;
  s->t00 = in_y0 && in_x0 ? (r0 + x0) * row : -1;
  s->t01 = in_y0 && in_x1 ? (r0 + x1) * row : -1;
  s->t10 = in_y1 && in_x0 ? (r1 + x0) * row : -1;
  s->t11 = in_y1 && in_x1 ? (r1 + x1) * row : -1;
  return true;
}

// VEC values of one tap (zeros for a tap outside the map).
template <int VEC, class D, class A>
OPBRIDGE_HD void load_tap(const D* __restrict__ p, int64_t tap, A* out) {
  if (tap < 0) {
    for (int k = 0; k < VEC; ++k) out[k] = A(0);
    return;
  }
  const Vec<D, VEC> v = *reinterpret_cast<const Vec<D, VEC>*>(p + tap);
  for (int k = 0; k < VEC; ++k) out[k] = to_acc(v.v[k]);
}

// The query/head r = (n * Lq + q) * M + m, and the offset of value[n, 0, m, 0].
OPBRIDGE_HD int64_t value_base(const Shape& z, int64_t r) {
  const int64_t m = r % z.M;
  const int64_t n = r / z.M / z.Lq;
  return (n * z.S * z.M + m) * z.D;
}

// Forward: the VEC outputs of thread idx (vector idx % DV of r = idx / DV), i.e.
// output[r * D + (idx % DV) * VEC + k] = out[k].
template <int VEC, class D, class A>
OPBRIDGE_HD void forward_vector(const D* __restrict__ value, const D* __restrict__ loc, const D* __restrict__ attn,
                                const Levels& lv, const Shape& z, int64_t idx, A* out) {
  const int64_t r = idx / z.DV;
  const int64_t dv = idx - r * z.DV;
  const int64_t row = z.M * z.D;
  const D* vp = value + value_base(z, r) + dv * VEC;
  const int64_t LP = z.L * z.P;
  const D* lp = loc + r * LP * 2;
  const D* ap = attn + r * LP;
  for (int k = 0; k < VEC; ++k) out[k] = A(0);
  for (int l = 0; l < z.L; ++l) {
    const int H = lv.h[l], W = lv.w[l];
    const int64_t start = lv.start[l];
    for (int64_t p = 0; p < z.P; ++p) {
      const int64_t j = l * z.P + p;
      Sample<A> s;
      if (!setup_sample<A>(to_acc(lp[2 * j]), to_acc(lp[2 * j + 1]), H, W, start, row, &s)) continue;
      const A a = to_acc(ap[j]);
      A v00[VEC], v01[VEC], v10[VEC], v11[VEC];
      load_tap<VEC>(vp, s.t00, v00);
      load_tap<VEC>(vp, s.t01, v01);
      load_tap<VEC>(vp, s.t10, v10);
      load_tap<VEC>(vp, s.t11, v11);
      // An off-map tap contributes nothing, also when a is infinite or NaN (not a * 0 = NaN).
      const A w00 = s.t00 < 0 ? A(0) : a * (s.hy * s.hx), w01 = s.t01 < 0 ? A(0) : a * (s.hy * s.fx);
      const A w10 = s.t10 < 0 ? A(0) : a * (s.fy * s.hx), w11 = s.t11 < 0 ? A(0) : a * (s.fy * s.fx);
      for (int k = 0; k < VEC; ++k) out[k] += w00 * v00[k] + w01 * v01[k] + w10 * v10[k] + w11 * v11[k];
    }
  }
}

// Backward, one lane's share of one valid sample s (attention weight a) of r:
//   *sv = sum over the lane's elements e of grad_output[e] * sampled value[e]
//   *sx, *sy: the same with the sample's derivative along pixel x / y
// and grad_value[tap + e] += a * w_tap * grad_output[e] for every tap inside the map.
//   vp, gv: value / grad_value (or its float workspace) at [n, 0, m, 0]; gv may be nullptr
//   gp:     grad_output at [r, 0]
template <int VEC, class D, class A, class GV>
OPBRIDGE_HD void backward_sample(const D* __restrict__ vp, const D* __restrict__ gp, GV* gv, int64_t DV, int lane,
                                 int G, A a, const Sample<A>& s, A* sv, A* sx, A* sy) {
  const A w00 = s.hy * s.hx, w01 = s.hy * s.fx, w10 = s.fy * s.hx, w11 = s.fy * s.fx;
  A tv = A(0), tx = A(0), ty = A(0);
  for (int64_t c = lane; c < DV; c += G) {
    const int64_t e = c * VEC;
    A g[VEC], v00[VEC], v01[VEC], v10[VEC], v11[VEC];
    load_tap<VEC>(gp, e, g);
    load_tap<VEC>(vp + e, s.t00, v00);
    load_tap<VEC>(vp + e, s.t01, v01);
    load_tap<VEC>(vp + e, s.t10, v10);
    load_tap<VEC>(vp + e, s.t11, v11);
    for (int k = 0; k < VEC; ++k) {
      const A val = w00 * v00[k] + w01 * v01[k] + w10 * v10[k] + w11 * v11[k];
      const A dx = s.hy * (v01[k] - v00[k]) + s.fy * (v11[k] - v10[k]);
      const A dy = s.hx * (v10[k] - v00[k]) + s.fx * (v11[k] - v01[k]);
      tv += g[k] * val;
      tx += g[k] * dx;
      ty += g[k] * dy;
    }
    if (gv != nullptr) {
      A ag[VEC];
      for (int k = 0; k < VEC; ++k) ag[k] = a * g[k];
      const auto scatter = [&](int64_t tap, A w) {
        if (tap < 0) return;  // outside the map
        A add[VEC];
        for (int k = 0; k < VEC; ++k) add[k] = w * ag[k];
        atomic_add_vec<VEC>(gv + tap + e, add);
      };
      scatter(s.t00, w00);
      scatter(s.t01, w01);
      scatter(s.t10, w10);
      scatter(s.t11, w11);
    }
  }
  *sv = tv;
  *sx = tx;
  *sy = ty;
}

// What lane 0 writes for sample j of r once the lanes' shares are summed (sv, sx, sy):
// grad_attention_weights[r * L * P + j] = sv, grad_sampling_locations[...] = (a * W * sx,
// a * H * sy) (d pixel x / d x = W). 0 for a sample that contributes nothing (whatever a is).
template <class A>
OPBRIDGE_HD void sample_grads(bool valid, A a, int H, int W, A sv, A sx, A sy, A* g_attn, A* g_x, A* g_y) {
  *g_attn = valid ? sv : A(0);
  *g_x = valid ? a * static_cast<A>(W) * sx : A(0);
  *g_y = valid ? a * static_cast<A>(H) * sy : A(0);
}

}  // namespace opbridge::cuda::msda
