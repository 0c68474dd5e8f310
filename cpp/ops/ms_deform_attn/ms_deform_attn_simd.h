// MultiScaleDeformableAttention kernels, templated on a SIMD policy S (common/simd_*.h for the
// float types, F64Lanes below for double). Internal header: included once per instruction set
// (ms_deform_attn_cpu.cpp, ms_deform_attn_cpu_avx2.cpp, ms_deform_attn_cpu_avx512.cpp), so
// everything here has internal linkage (see common/simd_avx512.h for why).
//
// Forward, per (n, m, q): the in-map taps of the query's L * P samples are listed first (pixel
// offset into value and weight = attention weight * bilinear weight; out-of-map taps are left
// out, never read), then every tap's D values are accumulated with vector FMAs, D in chunks
// of up to 4 vectors held in registers. Value rows are read straight from value's (N, S, M, D)
// layout: one tap reads D contiguous elements.
//
// Backward, per (n, m, level): for each query and sample, the dot products of grad_output with
// the (up to 4) tap rows give the attention-weight and location gradients, and each tap row of
// grad_value gets grad_output * weight added. Units never share a grad_value row (see
// opbridge/ms_deform_attn.h), so the result is deterministic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ms_deform_attn_isa.h"
#include "opbridge/dtype.h"
#include "opbridge/parallel.h"

namespace opbridge::msda_isa {
namespace {

// double lanes for the float64 kernels: plain fixed-length loops that the compiler vectorizes
// for the instruction set of the including TU. W = 8: one AVX-512 register, two AVX2 ones.
struct F64Lanes {
  static constexpr int W = 8;
  struct V {
    double v[W];
  };
  static V zero() { return set1(0.0); }
  static V set1(double a) {
    V r;
    for (int l = 0; l < W; ++l) r.v[l] = a;
    return r;
  }
  static V fmadd(V a, V b, V c) {
    V r;
    for (int l = 0; l < W; ++l) r.v[l] = a.v[l] * b.v[l] + c.v[l];
    return r;
  }
  static double hsum(V a) {
    double s = 0.0;
    for (int l = 0; l < W; ++l) s += a.v[l];
    return s;
  }
  static V load(const double* p) {
    V r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static V load_n(const double* p, int n) {
    V r = zero();
    for (int l = 0; l < n; ++l) r.v[l] = p[l];
    return r;
  }
  static void store(double* p, V a) { std::memcpy(p, a.v, sizeof a.v); }
  static void store_n(double* p, V a, int n) {
    for (int l = 0; l < n; ++l) p[l] = a.v[l];
  }
};

// Samples whose taps are listed at once: 256 taps (3 KB of offsets and weights, on the stack).
// Queries with more samples (L * P > 64) are accumulated block by block.
constexpr int64_t kBlockSamples = 64;
// Vectors of D accumulated per pass over a query's taps (registers: 4 accumulators, plus the
// broadcast weight and loads, fit every instruction set's register file).
constexpr int kMaxVectors = 4;

template <class A>
struct Level {
  A wf, hf;             // W and H as A, for the coordinate arithmetic
  int64_t W, H, start;  // width, height, first row of value's S axis
};

template <class A>
void load_levels(const int64_t* spatial_shapes, const int64_t* level_start_index, int64_t L, Level<A>* lv) {
  for (int64_t l = 0; l < L; ++l) {
    lv[l].H = spatial_shapes[2 * l];
    lv[l].W = spatial_shapes[2 * l + 1];
    lv[l].hf = static_cast<A>(lv[l].H);
    lv[l].wf = static_cast<A>(lv[l].W);
    lv[l].start = level_start_index[l];
  }
}

// One sample's taps: pixel coordinates, bilinear fractions and which of the four taps lie on
// the map. inside == false for a sample with no tap on the map (or a NaN / inf coordinate).
template <class A>
struct Sample {
  bool inside;
  A fx, fy;
  int64_t pix;         // row of value's S axis of tap (y0, x0) (may be off the map)
  bool t00, t01, t10, t11;  // taps (y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1) on the map
};

template <class A>
inline Sample<A> locate(A lx, A ly, const Level<A>& lv) {
  Sample<A> s{};
  const A x = lx * lv.wf - A(0.5);
  const A y = ly * lv.hf - A(0.5);
  // Written so that NaN fails: a sample with x <= -1 or x >= W (same for y) has no tap on the
  // map. Within these bounds floor() fits int64 (|x| < W <= S).
  s.inside = x > A(-1) && x < lv.wf && y > A(-1) && y < lv.hf;
  if (!s.inside) return s;
  const A x0f = std::floor(x), y0f = std::floor(y);
  s.fx = x - x0f;
  s.fy = y - y0f;
  const int64_t x0 = static_cast<int64_t>(x0f), y0 = static_cast<int64_t>(y0f);
  // x0 >= -1 and y0 >= -1 here. The upper bounds are checked in integers: W as A may have been
  // rounded up (W > 2^24 in float), so x < wf alone does not prove x0 < W.
  const bool xl = x0 >= 0 && x0 < lv.W, xh = x0 + 1 < lv.W;
  const bool yl = y0 >= 0 && y0 < lv.H, yh = y0 + 1 < lv.H;
  s.t00 = xl && yl;
  s.t01 = xh && yl;
  s.t10 = xl && yh;
  s.t11 = xh && yh;
  s.pix = lv.start + y0 * lv.W + x0;
  return s;
}

// Appends the sample's on-map taps (offset of the tap's row in elements, = pixel * row, and
// weight aw * bilinear weight) to off / wt; returns how many.
template <class A>
inline int add_taps(const Sample<A>& s, A aw, int64_t W, int64_t row, int64_t* off, A* wt) {
  if (!s.inside) return 0;
  const A gx = A(1) - s.fx, gy = A(1) - s.fy;
  // Branch-free compaction: every slot is written, the count advances only for on-map taps.
  int k = 0;
  off[k] = s.pix * row;
  wt[k] = aw * (gy * gx);
  k += s.t00;
  off[k] = (s.pix + 1) * row;
  wt[k] = aw * (gy * s.fx);
  k += s.t01;
  off[k] = (s.pix + W) * row;
  wt[k] = aw * (s.fy * gx);
  k += s.t10;
  off[k] = (s.pix + W + 1) * row;
  wt[k] = aw * (s.fy * s.fx);
  k += s.t11;
  return k;
}

// acc (K vectors, the last one `tail` lanes when kTail) += sum over taps of wt[t] * vb[off[t] ...].
template <class S, class T, int K, bool kTail>
inline void gather(const T* vb, const int64_t* off, const acc_t<T>* wt, int ntaps, int tail,
                   typename S::V* acc) {
  using V = typename S::V;
  for (int t = 0; t < ntaps; ++t) {
    const T* p = vb + off[t];
    const V w = S::set1(wt[t]);
    for (int j = 0; j < K; ++j) {
      if (kTail && j == K - 1) {
        acc[j] = S::fmadd(w, S::load_n(p + j * S::W, tail), acc[j]);
      } else {
        acc[j] = S::fmadd(w, S::load(p + j * S::W), acc[j]);
      }
    }
  }
}

// One chunk of K vectors of D (starting at vb / out / partial): accumulates the listed taps onto
// zero (first) or onto `partial`, and stores the sum to `out` (last) or back to `partial`.
template <class S, class T, int K, bool kTail>
inline void chunk(const T* vb, const int64_t* off, const acc_t<T>* wt, int ntaps, int tail, bool first,
                  bool last, acc_t<T>* partial, T* out) {
  using V = typename S::V;
  V acc[K];
  for (int j = 0; j < K; ++j) {
    const int n = kTail && j == K - 1 ? tail : S::W;
    acc[j] = first ? S::zero() : (n == S::W ? S::load(partial + j * S::W) : S::load_n(partial + j * S::W, n));
  }
  gather<S, T, K, kTail>(vb, off, wt, ntaps, tail, acc);
  for (int j = 0; j < K; ++j) {
    const int n = kTail && j == K - 1 ? tail : S::W;
    if (last) {
      if (n == S::W) {
        S::store(out + j * S::W, acc[j]);
      } else {
        S::store_n(out + j * S::W, acc[j], n);
      }
    } else if (n == S::W) {
      S::store(partial + j * S::W, acc[j]);
    } else {
      S::store_n(partial + j * S::W, acc[j], n);
    }
  }
}

template <class S, class T>
void chunks(const T* vb, const int64_t* off, const acc_t<T>* wt, int ntaps, int64_t D, bool first, bool last,
            acc_t<T>* partial, T* out) {
  constexpr int W = S::W;
  int64_t d0 = 0;
  for (; D - d0 >= kMaxVectors * W; d0 += kMaxVectors * W) {
    chunk<S, T, kMaxVectors, false>(vb + d0, off, wt, ntaps, W, first, last, partial + d0, out + d0);
  }
  const int64_t rem = D - d0;
  if (rem == 0) return;
  const int k = static_cast<int>((rem + W - 1) / W);
  const int tail = static_cast<int>(rem - (k - 1) * W);
  const bool full = tail == W;
  auto* pp = partial + d0;
  auto* po = out + d0;
  const T* pv = vb + d0;
#define OPBRIDGE_MSDA_CHUNK(K)                                                 \
  case K:                                                                      \
    if (full) {                                                                \
      chunk<S, T, K, false>(pv, off, wt, ntaps, tail, first, last, pp, po);    \
    } else {                                                                   \
      chunk<S, T, K, true>(pv, off, wt, ntaps, tail, first, last, pp, po);     \
    }                                                                          \
    break;
  switch (k) {
    OPBRIDGE_MSDA_CHUNK(1)
    OPBRIDGE_MSDA_CHUNK(2)
    OPBRIDGE_MSDA_CHUNK(3)
    default: OPBRIDGE_MSDA_CHUNK(4)
  }
#undef OPBRIDGE_MSDA_CHUNK
}

// Queries per parallel task at the least: about 64 KB of gathered values (a task of a few
// microseconds at the least, so that the pool's per-task cost stays small).
int64_t forward_grain(int64_t taps_per_query, int64_t D) {
  return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, taps_per_query * D));
}

template <class S, class T>
void msda_forward(const FwdArgs<T>& a, const ParallelFor& pf) {
  using A = acc_t<T>;
  const MsDeformAttnDims& d = a.d;
  const int64_t LP = d.L * d.P;
  const int64_t row = d.M * d.D;  // value's stride along S
  if (d.N == 0 || d.Lq == 0 || d.M == 0 || d.D == 0) return;  // empty output
  Level<A> lv[kMsDeformAttnMaxLevels];
  load_levels(a.spatial_shapes, a.level_start_index, d.L, lv);
  // Unit u = (n, m, q), q fastest: consecutive units (a task's range) sample one head of one
  // batch element, whose value rows stay in cache across its queries.
  const int64_t units = d.N * d.M * d.Lq;
  pf(units, forward_grain(4 * LP, d.D), [&](int64_t begin, int64_t end) {
    int64_t off[4 * kBlockSamples];
    A wt[4 * kBlockSamples];
    std::vector<A> partial(LP > kBlockSamples ? static_cast<size_t>(d.D) : 0);
    for (int64_t u = begin; u < end; ++u) {
      const int64_t q = u % d.Lq;
      const int64_t nm = u / d.Lq;
      const int64_t m = nm % d.M, n = nm / d.M;
      const int64_t nqm = (n * d.Lq + q) * d.M + m;
      const T* vb = a.value + n * d.S * row + m * d.D;
      const T* loc = a.sampling_locations + nqm * LP * 2;
      const T* aw = a.attention_weights + nqm * LP;
      T* out = a.output + nqm * d.D;
      if (LP == 0) {
        for (int64_t i = 0; i < d.D; ++i) out[i] = from_acc<T>(A(0));
        continue;
      }
      for (int64_t s0 = 0; s0 < LP; s0 += kBlockSamples) {
        const int64_t s1 = std::min(LP, s0 + kBlockSamples);
        int ntaps = 0;
        int64_t l = s0 / d.P, p = s0 % d.P;
        for (int64_t s = s0; s < s1; ++s) {
          const Sample<A> smp = locate(static_cast<A>(to_float(loc[2 * s])), static_cast<A>(to_float(loc[2 * s + 1])),
                                       lv[l]);
          ntaps += add_taps(smp, static_cast<A>(to_float(aw[s])), lv[l].W, row, off + ntaps, wt + ntaps);
          if (++p == d.P) {
            p = 0;
            ++l;
          }
        }
        chunks<S, T>(vb, off, wt, ntaps, d.D, s0 == 0, s1 == LP, partial.data(), out);
      }
    }
  });
}

// dot[k] = sum_d go[d] * rows[k][d] for the four tap rows, in one pass over D.
template <class S, class T>
inline void dot4(const T* go, const T* const* rows, int64_t D, double* dot) {
  using V = typename S::V;
  constexpr int W = S::W;
  V acc[4] = {S::zero(), S::zero(), S::zero(), S::zero()};
  int64_t d0 = 0;
  for (; d0 + W <= D; d0 += W) {
    const V g = S::load(go + d0);
    for (int k = 0; k < 4; ++k) acc[k] = S::fmadd(g, S::load(rows[k] + d0), acc[k]);
  }
  if (d0 < D) {
    const int n = static_cast<int>(D - d0);
    const V g = S::load_n(go + d0, n);
    for (int k = 0; k < 4; ++k) acc[k] = S::fmadd(g, S::load_n(rows[k] + d0, n), acc[k]);
  }
  for (int k = 0; k < 4; ++k) dot[k] = S::hsum(acc[k]);
}

// gv[d] += c * go[d] over D (gv in the accumulation type).
template <class S, class T>
inline void axpy(acc_t<T>* gv, acc_t<T> c, const T* go, int64_t D) {
  using V = typename S::V;
  constexpr int W = S::W;
  const V cv = S::set1(c);
  int64_t d0 = 0;
  for (; d0 + W <= D; d0 += W) S::store(gv + d0, S::fmadd(cv, S::load(go + d0), S::load(gv + d0)));
  if (d0 < D) {
    const int n = static_cast<int>(D - d0);
    S::store_n(gv + d0, S::fmadd(cv, S::load_n(go + d0, n), S::load_n(gv + d0, n)), n);
  }
}

template <class S, class T>
void msda_backward(const BwdArgs<T>& a, const ParallelFor& pf) {
  using A = acc_t<T>;
  // float and double accumulate grad_value in place; the 16-bit types in a float copy of the
  // unit's rows, rounded once at the end.
  constexpr bool kInPlace = std::is_same_v<T, A>;
  const MsDeformAttnDims& d = a.d;
  const int64_t row = d.M * d.D;
  const int64_t LP = d.L * d.P;
  if (d.N == 0 || d.M == 0) return;  // every output is empty
  Level<A> lv[kMsDeformAttnMaxLevels];
  load_levels(a.spatial_shapes, a.level_start_index, d.L, lv);
  const bool want_dots = a.grad_sampling_locations != nullptr || a.grad_attention_weights != nullptr;
  const int64_t units = d.N * d.M * d.L;
  pf(units, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> scratch;
    for (int64_t u = begin; u < end; ++u) {
      const int64_t l = u % d.L;
      const int64_t nm = u / d.L;
      const int64_t m = nm % d.M, n = nm / d.M;
      const Level<A>& lev = lv[l];
      const int64_t hw = lev.H * lev.W;
      const T* vb = a.value + n * d.S * row + m * d.D;
      // Where tap row `pix` (a row of value's S axis) accumulates its gradient:
      // gv + (pix - origin) * gstride.
      A* gv = nullptr;
      int64_t gstride = 0, origin = 0;
      if (a.grad_value != nullptr && d.D > 0) {
        if constexpr (kInPlace) {
          gv = a.grad_value + n * d.S * row + m * d.D;
          gstride = row;
          for (int64_t i = 0; i < hw; ++i) std::fill_n(gv + (lev.start + i) * row, d.D, A(0));
        } else {
          scratch.assign(static_cast<size_t>(hw * d.D), 0.f);
          gv = scratch.data();
          gstride = d.D;
          origin = lev.start;
        }
      }
      for (int64_t q = 0; q < d.Lq; ++q) {
        const int64_t nqm = (n * d.Lq + q) * d.M + m;
        const int64_t first = nqm * LP + l * d.P;  // sample index of (n, q, m, l, 0)
        const T* go = a.grad_output + nqm * d.D;
        const T* loc = a.sampling_locations + first * 2;
        const T* aw = a.attention_weights + first;
        T* gloc = a.grad_sampling_locations != nullptr ? a.grad_sampling_locations + first * 2 : nullptr;
        T* gaw = a.grad_attention_weights != nullptr ? a.grad_attention_weights + first : nullptr;
        for (int64_t p = 0; p < d.P; ++p) {
          const Sample<A> s = locate(static_cast<A>(to_float(loc[2 * p])), static_cast<A>(to_float(loc[2 * p + 1])), lev);
          if (!s.inside) {
            if (gloc != nullptr) gloc[2 * p] = gloc[2 * p + 1] = from_acc<T>(A(0));
            if (gaw != nullptr) gaw[p] = from_acc<T>(A(0));
            continue;
          }
          const A w = static_cast<A>(to_float(aw[p]));
          const bool on[4] = {s.t00, s.t01, s.t10, s.t11};
          const int64_t pix[4] = {s.pix, s.pix + 1, s.pix + lev.W, s.pix + lev.W + 1};
          const A gx = A(1) - s.fx, gy = A(1) - s.fy;
          const A bw[4] = {gy * gx, gy * s.fx, s.fy * gx, s.fy * s.fx};
          if (want_dots) {
            // Off-map taps read grad_output itself (valid memory) and their dots are dropped.
            const T* rows[4];
            for (int k = 0; k < 4; ++k) rows[k] = on[k] ? vb + pix[k] * row : go;
            double dot[4];
            dot4<S, T>(go, rows, d.D, dot);
            A g[4];
            for (int k = 0; k < 4; ++k) g[k] = on[k] ? static_cast<A>(dot[k]) : A(0);
            if (gaw != nullptr) gaw[p] = from_acc<T>(bw[0] * g[0] + bw[1] * g[1] + bw[2] * g[2] + bw[3] * g[3]);
            if (gloc != nullptr) {
              // d/dx of the bilinear sample is (1 - fy) (v01 - v00) + fy (v11 - v10), and
              // x = loc_x * W - 0.5.
              gloc[2 * p] = from_acc<T>(w * (gy * (g[1] - g[0]) + s.fy * (g[3] - g[2])) * lev.wf);
              gloc[2 * p + 1] = from_acc<T>(w * (gx * (g[2] - g[0]) + s.fx * (g[3] - g[1])) * lev.hf);
            }
          }
          if (gv != nullptr) {
            for (int k = 0; k < 4; ++k) {
              if (on[k]) axpy<S, T>(gv + (pix[k] - origin) * gstride, w * bw[k], go, d.D);
            }
          }
        }
      }
      if constexpr (!kInPlace) {
        if (gv != nullptr) {
          T* dst = a.grad_value + n * d.S * row + m * d.D;
          for (int64_t i = 0; i < hw; ++i) {
            const A* src = scratch.data() + i * d.D;
            T* out = dst + (lev.start + i) * row;
            int64_t d0 = 0;
            for (; d0 + S::W <= d.D; d0 += S::W) S::store(out + d0, S::load(src + d0));
            if (d0 < d.D) S::store_n(out + d0, S::load_n(src + d0, static_cast<int>(d.D - d0)), static_cast<int>(d.D - d0));
          }
        }
      }
    }
  });
}

}  // namespace
}  // namespace opbridge::msda_isa
