// GroupNorm backward for float, Half and BFloat16, written once over a SIMD wrapper and compiled
// once per instruction set, next to the forward (internal header, included after
// group_norm_simd.h).
//
// With z = (x - mean) * rstd * w + b the pre-activation and dz = dy * act'(z):
//   ds[n, c] = sum over the channel of dz * (x - mean),  db[n, c] = sum of dz,
//   dx = za[c] * dz + k2 * (x - m_hi) + c3, za[c] = rstd * w[c] and k2, c3 per group (see
//   gn_bwd_group_coefficients),
// and the caller forms dweight / dbias from ds, db and rstd. Statistics are recomputed from x
// with the forward's moment algorithm (gn_moments / gn_nhwc_moments: shifted float sums in
// blocks, merged in double), so the backward normalizes with the forward's mean and rstd to
// rounding (channels-last, the per-channel sums take the dy sums' order of additions, not
// gn_rows_sums'; contiguous without an activation, the group's shifted sums are taken channel by
// channel in the channel sums' pass, the group summed again as the forward would sum a block
// again); x - mean is taken as (x - m_hi) - m_lo (the forward's split), so a large
// common offset costs no digits.
//
// [N, C, S]: one task per (n, g) group: moments, the channel sums, then dx, all while the group
// (x and dy) is still in the thread's cache when it fits; memory is read about once. Without an
// activation the moments and the channel sums are one pass (gn_bwd_fused_channel_sums).
// [N, S, C]: parallel passes over tiles of rows, vectorized across channels: moments, the
// per-channel sums (in the moments pass when there is no activation), dx; in waves of samples
// whose x and dy stay in the threads' L2s between the passes where two samples or more fit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "group_norm_isa.h"
#include "group_norm_simd.h"
#include "opbridge/parallel.h"

namespace opbridge {
namespace {

// Rows of at least this many bytes count as long in the channels-last backward: four of them
// span a page or more, and where they come from memory it reads them one at a time
// (gn_bwd_row_by_row_moments, gn_bwd_rows_dx).
constexpr int64_t kGnBwdLongRowBytes = 1024;

// dz = dy * act'(z): silu'(z) = s * (1 + z * (1 - s)), s = 1 / (1 + exp(-z)). Where exp(-z)
// overflows (z < ~-110) s = 0 and dz = 0 * finite = 0, as the double formula gives.
template <class I, Activation A>
typename I::V gn_dz(typename I::V dy, typename I::V xv, typename I::V za, typename I::V zo) {
  using V = typename I::V;
  if constexpr (A == Activation::kSilu) {
    const V z = I::fmadd(xv, za, zo);
    const V one = I::set1(1.0f);
    const V s = I::div(one, I::add(one, gn_exp_neg<I>(z)));
    return I::mul(I::mul(dy, s), I::fmadd(z, I::sub(one, s), one));
  } else {
    (void)xv;
    (void)za;
    (void)zo;
    return dy;
  }
}

// Per-channel constants of the backward pass, given the group's mean and rstd: the
// pre-activation is z = (x - m_hi) * za + zo, the mean split as m_hi (float) + m_lo (double).
struct GnBwdChannel {
  float m_hi, za, zo;
  double m_lo;
};

template <class I, class T>
GnBwdChannel gn_bwd_channel(const T* weight, const T* bias, int64_t c, double mean, double rstd) {
  // The forward's coefficients (its za and zo are the normalization's a and off); the channels it
  // would evaluate in double are left to the float formula here, as in the float64 reference.
  GnBwdChannel k;
  double scale = 0.0, b = 0.0;
  (void)gn_channel_coefficients<I>(weight, bias, c, mean, rstd, &k.m_hi, &k.za, &k.zo, &scale, &b);
  k.m_lo = mean - static_cast<double>(k.m_hi);
  return k;
}

// dx's group constants k2, c3 (with za[c] = rstd * w[c] per channel) from the group's channel sums
// ds (taken around the true mean) and db: dx = rstd * (w dz - mean(w dz) - xhat * mean(w dz xhat)),
// xhat = (x - mean) * rstd, over the M elements of the group.
template <class I, class T>
void gn_bwd_group_coefficients(const T* weight, int64_t c0, int64_t Cg, double M, double mean, double rstd,
                               const double* ds, const double* db, float* k2, float* c3) {
  double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
  for (int64_t ci = 0; ci < Cg; ++ci) {
    const double w = weight != nullptr ? static_cast<double>(I::to_f32(weight[c0 + ci])) : 1.0;
    sum_dxhat += w * db[ci];
    sum_dxhat_xhat += w * ds[ci] * rstd;
  }
  const double m_lo = mean - static_cast<double>(static_cast<float>(mean));
  *k2 = static_cast<float>(-rstd * rstd * sum_dxhat_xhat / M);
  // x - mean = (x - m_hi) - m_lo: the m_lo part folds into the constant term.
  *c3 = static_cast<float>(-rstd * sum_dxhat / M - static_cast<double>(*k2) * m_lo);
}

// Whether the backward's sums pass keeps dz in dx for the dx pass to read instead of evaluating the
// activation's derivative again (an exponential and a division per element): with an activation,
// for float dx that is not streamed (too large for the caches, dz would go to memory and come
// back, which cost more than the arithmetic saved: 1.02-1.14x the time channels-last at
// (2, 512, 64, 64) and (8, 256, 32, 32) on a Zen 3) and is not x's memory (computed in place: the
// dx pass still reads x). 16-bit dx cannot hold dz without rounding it.
template <Activation A, class T>
bool gn_bwd_keeps_dz(const group_norm_isa::BackwardArgs<T>& a, bool stream) {
  return A != Activation::kNone && !stream && std::is_same_v<T, float> && a.dx != nullptr &&
         static_cast<const void*>(a.dx) != static_cast<const void*>(a.x);
}

// Elements per block of the channel sums: two accumulator pairs of W lanes, so each float lane
// sums at most kGnBwdBlock / (2 * W) <= 128 terms, and the pairs are added once, before folding
// into double (as kGnBlock).
constexpr int64_t kGnBwdBlock = kGnBlock / 2;

// The float lanes of sum(dz * (x - m_hi)) (*a) and sum(dz) (*q) over the elements [b, e) of one
// channel: two accumulator pairs (two chains of dependent additions per sum), added at the end.
// dz != nullptr: dz itself is stored there too (indexed as x), for the dx pass to read.
template <class I, Activation A, class T>
void gn_bwd_channel_lanes(const T* x, const T* dy, int64_t b, int64_t e, const GnBwdChannel& k, typename I::V* a,
                          typename I::V* q, float* dz) {
  using V = typename I::V;
  constexpr int W = I::W;
  const V mh = I::set1(k.m_hi), za = I::set1(k.za), zo = I::set1(k.zo);
  V a0 = I::zero(), a1 = I::zero(), q0 = I::zero(), q1 = I::zero();
  int64_t i = b;
  const auto lanes = [&](auto keep) {
    for (; i + 2 * W <= e; i += 2 * W) {
      const V x0 = I::sub(I::load(x + i), mh), x1 = I::sub(I::load(x + i + W), mh);
      const V d0 = gn_dz<I, A>(I::load(dy + i), x0, za, zo), d1 = gn_dz<I, A>(I::load(dy + i + W), x1, za, zo);
      if constexpr (decltype(keep)::value) {
        I::store(dz + i, d0);
        I::store(dz + i + W, d1);
      }
      a0 = I::fmadd(d0, x0, a0);
      a1 = I::fmadd(d1, x1, a1);
      q0 = I::add(q0, d0);
      q1 = I::add(q1, d1);
    }
    for (; i < e; i += W) {
      const int r = static_cast<int>(gn_min(W, e - i));
      // Lanes past the end are zero in both sums (dz and x - m_hi both masked to 0).
      const V xv = I::sub_n(I::load_n(x + i, r), mh, r);
      const V d = I::sub_n(gn_dz<I, A>(I::load_n(dy + i, r), xv, za, zo), I::zero(), r);
      if constexpr (decltype(keep)::value) I::store_n(dz + i, d, r);
      a0 = I::fmadd(d, xv, a0);
      q0 = I::add(q0, d);
    }
  };
  if (dz != nullptr) {
    lanes(std::true_type{});
  } else {
    lanes(std::false_type{});
  }
  *a = I::add(a0, a1);
  *q = I::add(q0, q1);
}

// sum(dz * (x - m_hi)) and sum(dz) over one channel's n contiguous elements, in float lanes
// folded into double every kGnBwdBlock elements.
template <class I, Activation A, class T>
void gn_bwd_channel_sums(const T* x, const T* dy, int64_t n, const GnBwdChannel& k, double* sum_dzx,
                         double* sum_dz, float* dz) {
  using V = typename I::V;
  double s1 = 0.0, s0 = 0.0;
  for (int64_t b0 = 0; b0 < n; b0 += kGnBwdBlock) {
    V a = I::zero(), q = I::zero();
    gn_bwd_channel_lanes<I, A>(x, dy, b0, gn_min(n, b0 + kGnBwdBlock), k, &a, &q, dz);
    s1 += I::hsum(a);
    s0 += I::hsum(q);
  }
  *sum_dzx = s1;
  *sum_dz = s0;
}

// Channels of at most this many elements have their sums taken W channels at a time
// (gn_bwd_short_channel_sums; each float lane then sums at most 256 / W terms, fewer than in
// gn_bwd_channel_sums). Kernel against a copy (C++ harness built with the release flags, Xeon, 2
// threads, alternated runs), one channel at a time -> W at a time: S = 64 (2, 1280, 8, 8)
// 4.4-4.5x -> 3.2-3.4x, + SiLU 10.5-10.9x -> 8.5x; S = 128 (4, 640, 8, 16) 3.7-3.8x -> 3.2-3.4x,
// + SiLU 8.6-9.3x -> 7.8-8.4x. At S = 256 it gains with SiLU ((2, 1280, 16, 16) 4.3-4.4x ->
// 3.9-4.0x), not without (2, 1280, 16, 16 2.2-2.3x -> 2.3-2.4x, others within noise); at S = 1024
// no clear gain either way.
template <Activation A>
constexpr int64_t kGnBwdShort = A == Activation::kNone ? 128 : 256;

// gn_bwd_channel_sums for the Cg channels of a group whose channels are short (S <= kGnBwdShort<A>),
// W channels at a time: each channel's float lanes are reduced together with its neighbours'
// (I::hsum_w), where one horizontal sum per channel and per sum cost more than the channel's
// elements at small S (at S = 64, as (2, 1280, 8, 8), four hsums per channel took about a third
// of the backward). Fills ds / db as gn_backward_nchw does.
template <class I, Activation A, class T>
void gn_bwd_short_channel_sums(const T* xg, const T* dyg, int64_t Cg, int64_t S, const GnBwdChannel* ks,
                               double* ds, double* db, float* dz) {
  using V = typename I::V;
  constexpr int W = I::W;
  V acc_dzx[W], acc_dz[W];
  double s_dzx[W], s_dz[W];
  for (int64_t c0 = 0; c0 < Cg; c0 += W) {
    const int nc = static_cast<int>(gn_min(W, Cg - c0));
    for (int j = 0; j < nc; ++j) {
      gn_bwd_channel_lanes<I, A>(xg + (c0 + j) * S, dyg + (c0 + j) * S, 0, S, ks[c0 + j], &acc_dzx[j], &acc_dz[j],
                                 dz != nullptr ? dz + (c0 + j) * S : nullptr);
    }
    for (int j = nc; j < W; ++j) acc_dzx[j] = acc_dz[j] = I::zero();
    I::hsum_w(acc_dzx, s_dzx);
    I::hsum_w(acc_dz, s_dz);
    for (int j = 0; j < nc; ++j) {
      ds[c0 + j] = s_dzx[j] - ks[c0 + j].m_lo * s_dz[j];
      db[c0 + j] = s_dz[j];
    }
  }
}

// Without an activation (dz = dy), the channel sums need not wait for the group's moments: one
// pass over the group takes, per channel, sum(dy * (x - shift)) (into sa), sum(dy) (db) and the
// shifted moments sum(x - shift), sum((x - shift)^2) (added into *sd, *sq), shift being the
// forward's first shift (gn_first_shift). The separate moments pass over x was about a sixth of
// the backward at (2, 1280, 8, 8) (with moments over one channel only it took 0.84 of the time
// on a Zen 3); this pass, which does that arithmetic still, took 0.89-0.92 of the time there and
// 0.73-0.89 at 2,128,64,64 to 1,128,256,256 (group_norm_ab.sh --backward --nchw). Float lanes as
// gn_bwd_channel_lanes: W channels at a time folded by I::hsum_w where channels are short,
// otherwise folded into double every kGnBwdBlock elements.
template <class I, class T>
void gn_bwd_fused_lanes(const T* x, const T* dy, int64_t b, int64_t e, typename I::V sh, typename I::V* a,
                        typename I::V* q, typename I::V* d, typename I::V* s) {
  using V = typename I::V;
  constexpr int W = I::W;
  V a0 = I::zero(), a1 = I::zero(), q0 = I::zero(), q1 = I::zero();
  V d0 = I::zero(), d1 = I::zero(), s0 = I::zero(), s1 = I::zero();
  int64_t i = b;
  for (; i + 2 * W <= e; i += 2 * W) {
    const V x0 = I::sub(I::load(x + i), sh), x1 = I::sub(I::load(x + i + W), sh);
    const V g0 = I::load(dy + i), g1 = I::load(dy + i + W);
    a0 = I::fmadd(g0, x0, a0);
    a1 = I::fmadd(g1, x1, a1);
    q0 = I::add(q0, g0);
    q1 = I::add(q1, g1);
    d0 = I::add(d0, x0);
    d1 = I::add(d1, x1);
    s0 = I::fmadd(x0, x0, s0);
    s1 = I::fmadd(x1, x1, s1);
  }
  for (; i < e; i += W) {
    const int r = static_cast<int>(gn_min(W, e - i));
    // Lanes past the end are zero in every sum (x - shift and dy both masked to 0).
    const V xv = I::sub_n(I::load_n(x + i, r), sh, r);
    const V g = I::sub_n(I::load_n(dy + i, r), I::zero(), r);
    a0 = I::fmadd(g, xv, a0);
    q0 = I::add(q0, g);
    d0 = I::add(d0, xv);
    s0 = I::fmadd(xv, xv, s0);
  }
  *a = I::add(a0, a1);
  *q = I::add(q0, q1);
  *d = I::add(d0, d1);
  *s = I::add(s0, s1);
}

template <class I, class T>
void gn_bwd_fused_channel_sums(const T* xg, const T* dyg, int64_t Cg, int64_t S, float shift, double* sa,
                               double* db, double* sd, double* sq) {
  using V = typename I::V;
  constexpr int W = I::W;
  const V sh = I::set1(shift);
  double group_sd = 0.0, group_sq = 0.0;
  if (S <= kGnBwdShort<Activation::kNone>) {
    V acc[4][W];
    double out[4][W];
    for (int64_t c0 = 0; c0 < Cg; c0 += W) {
      const int nc = static_cast<int>(gn_min(W, Cg - c0));
      for (int j = 0; j < nc; ++j) {
        gn_bwd_fused_lanes<I>(xg + (c0 + j) * S, dyg + (c0 + j) * S, 0, S, sh, &acc[0][j], &acc[1][j], &acc[2][j],
                              &acc[3][j]);
      }
      for (int j = nc; j < W; ++j) acc[0][j] = acc[1][j] = acc[2][j] = acc[3][j] = I::zero();
      for (int k = 0; k < 4; ++k) I::hsum_w(acc[k], out[k]);
      for (int j = 0; j < nc; ++j) {
        sa[c0 + j] = out[0][j];
        db[c0 + j] = out[1][j];
        group_sd += out[2][j];
        group_sq += out[3][j];
      }
    }
  } else {
    V lanes[4];
    for (int64_t ci = 0; ci < Cg; ++ci) {
      double t[4] = {0.0, 0.0, 0.0, 0.0};
      for (int64_t b0 = 0; b0 < S; b0 += kGnBwdBlock) {
        gn_bwd_fused_lanes<I>(xg + ci * S, dyg + ci * S, b0, gn_min(S, b0 + kGnBwdBlock), sh, &lanes[0], &lanes[1],
                              &lanes[2], &lanes[3]);
        for (int k = 0; k < 4; ++k) t[k] += I::hsum(lanes[k]);
      }
      sa[ci] = t[0];
      db[ci] = t[1];
      group_sd += t[2];
      group_sq += t[3];
    }
  }
  *sd = group_sd;
  *sq = group_sq;
}

// dx[0..n) = za * dz + k2 * (x - m_hi) + c3 over one channel's contiguous elements. Stream:
// non-temporal stores (the elements before the first vector-aligned one stored normally).
template <class I, Activation A, bool Stream, class T>
void gn_bwd_channel_dx(const T* x, const T* dy, T* dx, int64_t n, const GnBwdChannel& k, float k2, float c3) {
  using V = typename I::V;
  constexpr int W = I::W;
  const V mh = I::set1(k.m_hi), za = I::set1(k.za), zo = I::set1(k.zo);
  const V vk2 = I::set1(k2), vc3 = I::set1(c3);
  const auto f = [&](V xr, V dyv) {
    const V xv = I::sub(xr, mh);
    return I::fmadd(za, gn_dz<I, A>(dyv, xv, za, zo), I::fmadd(vk2, xv, vc3));
  };
  int64_t i = 0;
  if (Stream) {
    const int64_t head = gn_unaligned_head<I>(dx);
    if (head > 0) {
      i = gn_min(head, n);
      const int r = static_cast<int>(i);
      I::store_n(dx, f(I::load_n(x, r), I::load_n(dy, r)), r);
    }
  }
  for (; i + W <= n; i += W) {
    gn_store<I, Stream>(dx + i, f(I::load(x + i), I::load(dy + i)));
  }
  if (i < n) {
    const int r = static_cast<int>(n - i);
    I::store_n(dx + i, f(I::load_n(x + i, r), I::load_n(dy + i, r)), r);
  }
}

template <class I, Activation A, class T>
void gn_backward_nchw(const group_norm_isa::BackwardArgs<T>& a, const ParallelFor& pf) {
  const int64_t C = a.d.C, G = a.d.G, Cg = C / G, S = a.d.S;
  const int64_t group_elems = Cg * S;
  const int64_t grain = group_elems >= kGnMinTaskElems ? 1 : kGnMinTaskElems / group_elems;
  const bool stream = a.dx != nullptr && a.d.N * C * S * static_cast<int64_t>(sizeof(T)) >= a.stream_bytes;
  // Where kept, dz is read back while the group is still in the cache.
  const bool keep_dz = gn_bwd_keeps_dz<A>(a, stream);
  pf(a.d.N * G, grain, [&](int64_t begin, int64_t end) {
    std::vector<GnBwdChannel> ks(static_cast<size_t>(Cg));
    for (int64_t ng = begin; ng < end; ++ng) {
      const int64_t n = ng / G, g = ng % G, c0 = g * Cg;
      const T* xg = a.x + ng * group_elems;
      const T* dyg = a.dy + ng * group_elems;
      double* ds = a.ds + n * C + c0;
      double* db = a.db + n * C + c0;
      double mean = 0.0, var = 0.0;
      // Without an activation the channel sums come with the moments, in one pass (sums around
      // the forward's first shift, ds moved to the mean below), unless the group's mean lies
      // further from that shift than its spread (the forward's criterion for summing a block
      // again, gn_needs_recentering): then the moments and the sums are taken as with an
      // activation, the pass's sums discarded.
      bool fused = false;
      double fused_shift = 0.0;
      if constexpr (A == Activation::kNone) {
        const float shift = gn_first_shift<I>(xg, group_elems);
        double sd = 0.0, sq = 0.0;
        gn_bwd_fused_channel_sums<I>(xg, dyg, Cg, S, shift, ds, db, &sd, &sq);
        const double M = static_cast<double>(group_elems);
        if (!gn_needs_recentering(M, sd, sq)) {
          fused = true;
          fused_shift = static_cast<double>(shift);
          mean = fused_shift + sd / M;
          var = (sq - sd * (sd / M)) / M;
          if (var < 0.0) var = 0.0;  // rounding; NaN stays NaN
        }
      }
      if (!fused) gn_moments<I>(xg, group_elems, &mean, &var);
      const double rstd = 1.0 / std::sqrt(var + a.eps);
      a.rstd[ng] = rstd;
      for (int64_t ci = 0; ci < Cg; ++ci) ks[ci] = gn_bwd_channel<I>(a.weight, a.bias, c0 + ci, mean, rstd);
      float* const dzg = keep_dz ? reinterpret_cast<float*>(a.dx) + ng * group_elems : nullptr;
      if (fused) {
        // sum(dy * (x - mean)) = sum(dy * (x - shift)) - (mean - shift) * sum(dy).
        for (int64_t ci = 0; ci < Cg; ++ci) ds[ci] -= (mean - fused_shift) * db[ci];
      } else if (S <= kGnBwdShort<A>) {
        gn_bwd_short_channel_sums<I, A>(xg, dyg, Cg, S, ks.data(), ds, db, dzg);
      } else {
        for (int64_t ci = 0; ci < Cg; ++ci) {
          double s_dzx = 0.0, s_dz = 0.0;
          gn_bwd_channel_sums<I, A>(xg + ci * S, dyg + ci * S, S, ks[ci], &s_dzx, &s_dz,
                                    dzg != nullptr ? dzg + ci * S : nullptr);
          ds[ci] = s_dzx - ks[ci].m_lo * s_dz;
          db[ci] = s_dz;
        }
      }
      if (a.dx == nullptr) continue;
      float k2 = 0.f, c3 = 0.f;
      gn_bwd_group_coefficients<I>(a.weight, c0, Cg, static_cast<double>(group_elems), mean, rstd, ds, db, &k2, &c3);
      for (int64_t ci = 0; ci < Cg; ++ci) {
        T* dxc = a.dx + ng * group_elems + ci * S;
        if (keep_dz) {
          gn_bwd_channel_dx<I, Activation::kNone, false>(xg + ci * S, dxc, dxc, S, ks[ci], k2, c3);
        } else if (stream) {
          gn_bwd_channel_dx<I, A, true>(xg + ci * S, dyg + ci * S, dxc, S, ks[ci], k2, c3);
        } else {
          gn_bwd_channel_dx<I, A, false>(xg + ci * S, dyg + ci * S, dxc, S, ks[ci], k2, c3);
        }
      }
    }
    if (stream) I::fence();
  });
}

// Per-channel arrays of one [N, S, C] sample for the row loops.
struct GnBwdRowCoefficients {
  std::vector<float> mh, za, zo, k2, c3;
  void resize(int64_t C) {
    for (auto* v : {&mh, &za, &zo, &k2, &c3}) v->resize(static_cast<size_t>(C));
  }
};

// s1[c] += sum over rows of dz * (x - m_hi), s0[c] += sum of dz, for `rows` rows of C channels;
// dz != nullptr: dz itself is stored there too (rows of C, as x), for the dx pass to read.
// Row-major, two rows at a time, with the per-channel sums in L1 (as gn_rows_sums:
// sequential streams the hardware prefetchers follow; walking down the columns stalls on every
// row). Full vectors with plain loads and stores, the channels past the last full vector with
// masked ones: AVX2's masked stores are microcoded on AMD (Zen 3: masked moves for every vector
// made this pass, with SiLU, 2.2-2.8x slower at (2, 512, 64, 64) and (8, 256, 32, 32)
// channels-last).
template <class I, Activation A, class T>
void gn_bwd_rows_sums(const T* x, const T* dy, int64_t rows, int64_t C, const GnBwdRowCoefficients& k, float* s1,
                      float* s0, float* dz) {
  using V = typename I::V;
  constexpr int W = I::W;
  const float* mh = k.mh.data();
  const float* za = k.za.data();
  const float* zo = k.zo.data();
  const int64_t cv = C / W * W;
  const int tail = static_cast<int>(C - cv);
  const auto sums = [&](auto keeps) {
    constexpr bool kKeep = decltype(keeps)::value;
    const auto keep = [&](int64_t off, V g) {
      if constexpr (kKeep) I::store(dz + off, g);
    };
    const auto keep_n = [&](int64_t off, V g) {
      if constexpr (kKeep) I::store_n(dz + off, g, tail);
    };
    int64_t row = 0;
    for (; row + 2 <= rows; row += 2) {
      const T* x0 = x + row * C;
      const T* x1 = x0 + C;
      const T* d0 = dy + row * C;
      const T* d1 = d0 + C;
      for (int64_t c = 0; c < cv; c += W) {
        const V m = I::load(mh + c), a = I::load(za + c), o = I::load(zo + c);
        const V xv0 = I::sub(I::load(x0 + c), m), xv1 = I::sub(I::load(x1 + c), m);
        const V g0 = gn_dz<I, A>(I::load(d0 + c), xv0, a, o), g1 = gn_dz<I, A>(I::load(d1 + c), xv1, a, o);
        keep(row * C + c, g0);
        keep((row + 1) * C + c, g1);
        I::store(s1 + c, I::add(I::load(s1 + c), I::fmadd(g0, xv0, I::mul(g1, xv1))));
        I::store(s0 + c, I::add(I::load(s0 + c), I::add(g0, g1)));
      }
    }
    for (; row < rows; ++row) {
      const T* x0 = x + row * C;
      const T* d0 = dy + row * C;
      for (int64_t c = 0; c < cv; c += W) {
        const V xv0 = I::sub(I::load(x0 + c), I::load(mh + c));
        const V g0 = gn_dz<I, A>(I::load(d0 + c), xv0, I::load(za + c), I::load(zo + c));
        keep(row * C + c, g0);
        I::store(s1 + c, I::fmadd(g0, xv0, I::load(s1 + c)));
        I::store(s0 + c, I::add(I::load(s0 + c), g0));
      }
    }
    if (tail > 0) {
      // Lanes past C: x - m_hi and dz are 0 (nothing loaded), and they are not stored. The rows in
      // the order above (pairs, then the odd one), so that each lane sums as the full vectors do.
      const V m = I::load_n(mh + cv, tail), a = I::load_n(za + cv, tail), o = I::load_n(zo + cv, tail);
      V t1 = I::load_n(s1 + cv, tail), t0 = I::load_n(s0 + cv, tail);
      for (row = 0; row + 2 <= rows; row += 2) {
        const int64_t off = row * C + cv;
        const V xv0 = I::sub(I::load_n(x + off, tail), m), xv1 = I::sub(I::load_n(x + off + C, tail), m);
        const V g0 = gn_dz<I, A>(I::load_n(dy + off, tail), xv0, a, o);
        const V g1 = gn_dz<I, A>(I::load_n(dy + off + C, tail), xv1, a, o);
        keep_n(off, g0);
        keep_n(off + C, g1);
        t1 = I::add(t1, I::fmadd(g0, xv0, I::mul(g1, xv1)));
        t0 = I::add(t0, I::add(g0, g1));
      }
      for (; row < rows; ++row) {
        const int64_t off = row * C + cv;
        const V xv0 = I::sub(I::load_n(x + off, tail), m);
        const V g0 = gn_dz<I, A>(I::load_n(dy + off, tail), xv0, a, o);
        keep_n(off, g0);
        t1 = I::fmadd(g0, xv0, t1);
        t0 = I::add(t0, g0);
      }
      I::store_n(s1 + cv, t1, tail);
      I::store_n(s0 + cv, t0, tail);
    }
  };
  if (dz != nullptr) {
    sums(std::true_type{});
  } else {
    sums(std::false_type{});
  }
}

// dx for `rows` rows of C channels with per-channel coefficients. Stream: non-temporal stores,
// for rows whose every vector is aligned (C a multiple of W, dx vector-aligned). Two rows at a
// time, so that each vector of the five coefficients serves two rows; full vectors with plain
// loads, the channels past the last full vector with masked ones.
template <class I, Activation A, bool Stream, class T>
void gn_bwd_rows_dx(const T* x, const T* dy, T* dx, int64_t rows, int64_t C, const GnBwdRowCoefficients& k,
                    bool one_row) {
  using V = typename I::V;
  constexpr int W = I::W;
  const float* mh = k.mh.data();
  const float* za = k.za.data();
  const float* zo = k.zo.data();
  const float* k2 = k.k2.data();
  const float* c3 = k.c3.data();
  const int64_t cv = C / W * W;
  const int tail = static_cast<int>(C - cv);
  // dx of loaded x and dy with the coefficients m_hi, za, zo, k2, c3.
  const auto value = [](V xr, V dyv, V m, V a, V o, V q, V e) {
    const V xv = I::sub(xr, m);
    return I::fmadd(a, gn_dz<I, A>(dyv, xv, a, o), I::fmadd(q, xv, e));
  };
  const auto put = [](T* p, V v) { gn_store<I, Stream>(p, v); };
  int64_t row = 0;
  // Two rows per load of the coefficients, or one (one_row: long rows from memory, see
  // gn_backward_nhwc): six streams instead of three took 1.10-1.25x the time of the whole
  // backward at (2, 512, 64, 64) and (8, 256, 32, 32) on an AMD EPYC Zen 3 (2 threads, side by
  // side in one process); the same at (4, 64, 128, 128), (32, 64, 32, 32) and (64, 32, 32, 32),
  // whose two rows are 512 bytes or less.
  for (; !one_row && row + 2 <= rows; row += 2) {
    const T* x0 = x + row * C;
    const T* x1 = x0 + C;
    const T* d0 = dy + row * C;
    const T* d1 = d0 + C;
    T* o0 = dx + row * C;
    T* o1 = o0 + C;
    for (int64_t c = 0; c < cv; c += W) {
      const V m = I::load(mh + c), a = I::load(za + c), o = I::load(zo + c);
      const V q = I::load(k2 + c), e = I::load(c3 + c);
      put(o0 + c, value(I::load(x0 + c), I::load(d0 + c), m, a, o, q, e));
      put(o1 + c, value(I::load(x1 + c), I::load(d1 + c), m, a, o, q, e));
    }
  }
  for (; row < rows; ++row) {
    const T* x0 = x + row * C;
    const T* d0 = dy + row * C;
    T* o0 = dx + row * C;
    for (int64_t c = 0; c < cv; c += W) {
      put(o0 + c, value(I::load(x0 + c), I::load(d0 + c), I::load(mh + c), I::load(za + c), I::load(zo + c),
                        I::load(k2 + c), I::load(c3 + c)));
    }
  }
  if (tail > 0) {
    // Streaming needs C a multiple of W, so these stores are never streamed.
    for (row = 0; row < rows; ++row) {
      const int64_t off = row * C + cv;
      I::store_n(dx + off,
                 value(I::load_n(x + off, tail), I::load_n(dy + off, tail), I::load_n(mh + cv, tail),
                       I::load_n(za + cv, tail), I::load_n(zo + cv, tail), I::load_n(k2 + cv, tail),
                       I::load_n(c3 + cv, tail)),
                 tail);
    }
  }
}

// Without an activation: per-channel sums over `rows` rows (rows `ld` elements apart) of the C
// channels at x and dy, around the shifts sh: s1 += x - sh, s2 += (x - sh)^2, s3 += dy,
// s4 += dy * (x - sh). Row-major, four rows at a time (four sequential streams per input, as
// gn_rows_sums), the four rows' terms summed first: each per-channel sum (in L1) takes one
// addition per four rows.
template <class I, class T>
void gn_bwd_rows_moments(const T* x, const T* dy, int64_t rows, int64_t C, int64_t ld, const float* sh, float* s1,
                         float* s2, float* s3, float* s4) {
  using V = typename I::V;
  constexpr int W = I::W;
  // Channels [c, c + r) of rows [row, row + 4) (r < W: masked loads; lanes past C are never stored).
  const auto four_rows = [&](int64_t row, int64_t c, int r) {
    const T* x0 = x + row * ld + c;
    const T* d0 = dy + row * ld + c;
    const auto load = [&](const auto* p) { return r == W ? I::load(p) : I::load_n(p, r); };
    const V s = load(sh + c);
    const V a0 = I::sub(load(x0), s), a1 = I::sub(load(x0 + ld), s);
    const V a2 = I::sub(load(x0 + 2 * ld), s), a3 = I::sub(load(x0 + 3 * ld), s);
    const V g0 = load(d0), g1 = load(d0 + ld), g2 = load(d0 + 2 * ld), g3 = load(d0 + 3 * ld);
    const V sa = I::add(I::add(a0, a1), I::add(a2, a3));
    const V sq = I::add(I::fmadd(a0, a0, I::mul(a1, a1)), I::fmadd(a2, a2, I::mul(a3, a3)));
    const V sg = I::add(I::add(g0, g1), I::add(g2, g3));
    const V sga = I::add(I::fmadd(g0, a0, I::mul(g1, a1)), I::fmadd(g2, a2, I::mul(g3, a3)));
    if (r == W) {
      I::store(s1 + c, I::add(I::load(s1 + c), sa));
      I::store(s2 + c, I::add(I::load(s2 + c), sq));
      I::store(s3 + c, I::add(I::load(s3 + c), sg));
      I::store(s4 + c, I::add(I::load(s4 + c), sga));
    } else {
      I::store_n(s1 + c, I::add(I::load_n(s1 + c, r), sa), r);
      I::store_n(s2 + c, I::add(I::load_n(s2 + c, r), sq), r);
      I::store_n(s3 + c, I::add(I::load_n(s3 + c, r), sg), r);
      I::store_n(s4 + c, I::add(I::load_n(s4 + c, r), sga), r);
    }
  };
  int64_t row = 0;
  for (; row + 4 <= rows; row += 4) {
    int64_t c = 0;
    for (; c + W <= C; c += W) four_rows(row, c, W);
    if (c < C) four_rows(row, c, static_cast<int>(C - c));
  }
  for (; row < rows; ++row) {
    const T* x0 = x + row * ld;
    const T* d0 = dy + row * ld;
    for (int64_t c = 0; c < C; c += W) {
      const int r = static_cast<int>(gn_min(W, C - c));
      const V a0 = I::sub(I::load_n(x0 + c, r), I::load_n(sh + c, r));
      const V g0 = I::load_n(d0 + c, r);
      I::store_n(s1 + c, I::add(I::load_n(s1 + c, r), a0), r);
      I::store_n(s2 + c, I::fmadd(a0, a0, I::load_n(s2 + c, r)), r);
      I::store_n(s3 + c, I::add(I::load_n(s3 + c, r), g0), r);
      I::store_n(s4 + c, I::fmadd(g0, a0, I::load_n(s4 + c, r)), r);
    }
  }
}

// gn_bwd_rows_moments one row at a time: two sequential streams (x's row, dy's) instead of
// eight, each per-channel sum (in L1) taking one addition per row (so blocks of kGnMaxBlockRows
// rows: GnBwdDySums::max_block_rows). For x and dy that come from memory in rows of
// kGnBwdLongRowBytes or more, where four rows a step reads four pages at once. On an AMD EPYC
// Zen 3 (AVX2, 2 threads): a plain sum of x and dy at (8, 256, 32, 32) took 1.0-1.3x a copy one
// row at a time and 1.8-2.6x four rows a step (separate runs); side by side with four rows a
// step in one process (benchmarks/cpp/group_norm_ab.sh --backward), this pass's change alone
// 0.80-0.88 of the whole backward's time at (2, 512, 64, 64) and 0.82-0.93 at (8, 256, 32, 32),
// with the dx pass's (gn_bwd_rows_dx) 0.73-0.79 and 0.61-0.94, (2, 320, 64, 64) 0.62-0.70,
// (1, 512, 64, 64) the same. Not for short rows, whose four rows are one sequential run already
// ((32, 64, 32, 32) 1.13, (64, 32, 32, 32) 1.22), nor from the L3 (2 MiB samples: 1.1-1.9x),
// where the sums' loads and stores are the limit.
template <class I, class T>
void gn_bwd_row_by_row_moments(const T* x, const T* dy, int64_t rows, int64_t C, int64_t ld, const float* sh,
                               float* s1, float* s2, float* s3, float* s4) {
  using V = typename I::V;
  constexpr int W = I::W;
  const int64_t cv = C / W * W;
  const int tail = static_cast<int>(C - cv);
  // Channels [c, c + r) of row xr / gr (r < W: masked loads and stores; lanes past C are never
  // stored).
  const auto one_row = [&](const T* xr, const T* gr, int64_t c, int r) {
    const auto load = [&](const auto* p) { return r == W ? I::load(p) : I::load_n(p, r); };
    const auto store = [&](float* p, V v) { r == W ? I::store(p, v) : I::store_n(p, v, r); };
    const V d = r == W ? I::sub(I::load(xr + c), I::load(sh + c)) : I::sub_n(load(xr + c), load(sh + c), r);
    const V g = load(gr + c);
    store(s1 + c, I::add(load(s1 + c), d));
    store(s2 + c, I::fmadd(d, d, load(s2 + c)));
    store(s3 + c, I::add(load(s3 + c), g));
    store(s4 + c, I::fmadd(g, d, load(s4 + c)));
  };
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * ld;
    const T* gr = dy + r * ld;
    for (int64_t c = 0; c < cv; c += W) one_row(xr, gr, c, W);
    if (tail > 0) one_row(xr, gr, cv, tail);
  }
}

// The sums policy of gn_nhwc_moments (see GnXSums) for the backward without an activation: in
// the same read as x's moments, per channel sum_dy and sum_dyx = sum dy * (x - ref), ref[c] the
// tile's first shift. A group summed again around its own mean has its dy sums redone too (they
// would otherwise carry a large multiple of sum dy into sum_dyx).
template <class I, class T>
struct GnBwdDySums {
  const T* x;
  const T* dy;
  int64_t C;
  float* ref;        // [C]
  double* sum_dyx;   // [C]
  double* sum_dy;    // [C]
  float* s3;         // [C] scratch: the block's sum dy
  float* s4;         // [C] scratch: the block's sum dy * (x - sh)
  bool row_by_row;   // gn_bwd_row_by_row_moments (x and dy from memory), else gn_bwd_rows_moments
  // Whether a block was added into sum_dyx / sum_dy yet: the first one stores instead of adding,
  // so they need no pass of zeros first (their memory is the kept GnBwdScratch).
  bool started = false;

  // gn_bwd_rows_moments adds four rows at a time into each per-channel sum (as GnXSums), the
  // row-by-row variant one.
  int64_t max_block_rows() const { return row_by_row ? kGnMaxBlockRows : 4 * kGnMaxBlockRows; }
  void start(const float* sh) { std::copy(sh, sh + C, ref); }
  void sum(int64_t r0, int64_t nr, int64_t c0, int64_t width, const float* sh, float* s1, float* s2) {
    for (int64_t c = c0; c < c0 + width; ++c) s3[c] = s4[c] = 0.f;
    const int64_t off = r0 * C + c0;
    if (row_by_row) {
      gn_bwd_row_by_row_moments<I>(x + off, dy + off, nr, width, C, sh + c0, s1 + c0, s2 + c0, s3 + c0, s4 + c0);
    } else {
      gn_bwd_rows_moments<I>(x + off, dy + off, nr, width, C, sh + c0, s1 + c0, s2 + c0, s3 + c0, s4 + c0);
    }
  }
  void end_block(const float* sh) {
    for (int64_t c = 0; c < C; ++c) {
      const double dyx = static_cast<double>(s4[c]) +
                         (static_cast<double>(sh[c]) - static_cast<double>(ref[c])) * static_cast<double>(s3[c]);
      sum_dyx[c] = started ? sum_dyx[c] + dyx : dyx;
      sum_dy[c] = started ? sum_dy[c] + static_cast<double>(s3[c]) : static_cast<double>(s3[c]);
    }
    started = true;
  }
};

// The channels-last backward's per-tile scratch: per-channel sums and shifts, per-group moments.
struct GnBwdScratch {
  std::vector<double> pds, pdb;
  std::vector<float> tsh;
  std::vector<GnMoments> partial;

  size_t bytes() const {
    return (pds.size() + pdb.size()) * sizeof(double) + tsh.size() * sizeof(float) +
           partial.size() * sizeof(GnMoments);
  }
};

// At least n elements (the caller writes every one it reads; only growth allocates).
template <class E>
E* gn_at_least(std::vector<E>* v, size_t n) {
  if (v->size() < n) {
    v->clear();
    v->resize(n);
  }
  return v->data();
}

// Scratch of type S that each thread keeps from one use to the next (one call, or one parallel
// range, then the next), up to kGnKeptScratchBytes (S::bytes()); the users size it and write
// every element before reading it. The calling thread's GnBwdScratch holds about 20 C bytes per
// tile of 512 KB of x and dy (1.2% of their size at C = 320, 4.9% at C = 1280; 16 MB serves
// 330 MB of them at C = 1280). Allocated anew, its pages were faulted in and zeroed at every
// call, serially before the first pass: (2, 512, 64, 64) channels-last took 2.83-2.86x a copy
// that way, 2.46-2.50x with the scratch kept (C++ harness, Xeon, 2 threads). The per-range
// scratch (GnBwdTileScratch, GnBwdSampleCoefficients: a few C-sized arrays) was allocated and
// zeroed in every range of every pass: at (2, 1280, 8, 8) memset alone was 4-5% of the samples,
// and the backward took 0.93-0.96x the time with it kept (group_norm_ab.sh --backward, AMD EPYC
// Zen 3, 2 threads, four runs; with the dy sums' first block stored instead of added to
// zeros). A use nested on the same thread (none is known) finds nothing kept and allocates its own.
// Arguments, where given, go to S::reset (sizing it for this use) as it is taken.
constexpr size_t kGnKeptScratchBytes = size_t{16} << 20;
template <class S>
class GnKept {
 public:
  template <class... R>
  explicit GnKept(const R&... r) : s_(std::move(slot())) {
    if constexpr (sizeof...(R) > 0) s_.reset(r...);
  }
  ~GnKept() {
    if (s_.bytes() <= kGnKeptScratchBytes) slot() = std::move(s_);
  }
  GnKept(const GnKept&) = delete;
  GnKept& operator=(const GnKept&) = delete;
  S& get() { return s_; }

 private:
  static S& slot() {
    static thread_local S s;
    return s;
  }
  S s_;
};

// The moments pass's per-range scratch: the statistics' (GnRowScratch) and, without an
// activation, the block's dy sums.
struct GnBwdTileScratch {
  GnRowScratch rows;
  std::vector<float> s3, s4;
  void reset(int64_t C, int64_t G, bool dy_sums) {
    rows.reset(C, G);
    s3.resize(dy_sums ? static_cast<size_t>(C) : 0);
    s4.resize(s3.size());
  }
  size_t bytes() const { return rows.bytes() + (s3.capacity() + s4.capacity()) * sizeof(float); }
};

// The per-sample steps of the channels-last backward between its passes, for one range of a
// pass: the statistics of a wave's local sample j from its tiles' moments (mean, rstd per group;
// the pre-activation constants mh, za, zo per channel), then ds, db from its tiles' channel sums
// and the dx constants k2, c3. Each step is redone only when the range moves to another sample.
// Kept per thread (GnKept, reset for each range).
template <class T>
struct GnBwdSampleCoefficients {
  const group_norm_isa::BackwardArgs<T>* args = nullptr;
  int64_t C = 0, G = 0, Cg = 0, S = 0, tps = 0;
  GnBwdRowCoefficients k;
  std::vector<double> mean, rstd, ds, db;
  std::vector<GnMoments> merged;  // the sample's groups' moments, merged over its tiles
  int64_t have_stats = -1, have_sums = -1;

  void reset(const group_norm_isa::BackwardArgs<T>& a, int64_t C_, int64_t G_, int64_t Cg_, int64_t S_,
             int64_t tps_) {
    args = &a;
    C = C_, G = G_, Cg = Cg_, S = S_, tps = tps_;
    k.resize(C);
    for (auto* v : {&mean, &rstd}) v->resize(static_cast<size_t>(G));
    for (auto* v : {&ds, &db}) v->resize(static_cast<size_t>(C));
    merged.resize(static_cast<size_t>(G));
    have_stats = have_sums = -1;
  }
  size_t bytes() const {
    return (k.mh.capacity() + k.za.capacity() + k.zo.capacity() + k.k2.capacity() + k.c3.capacity()) * sizeof(float) +
           (mean.capacity() + rstd.capacity() + ds.capacity() + db.capacity()) * sizeof(double) +
           merged.capacity() * sizeof(GnMoments);
  }

  // part: the sample's tiles' moments ([tps, G]).
  template <class I>
  void statistics(int64_t j, const GnMoments* part) {
    if (j == have_stats) return;
    const group_norm_isa::BackwardArgs<T>& a = *args;
    // Group by group: an integer division per channel (c / Cg) cost more than the channel's own
    // arithmetic.
    gn_merge_tiles(part, tps, G, merged.data());
    for (int64_t g = 0; g < G; ++g) {
      const GnMoments& m = merged[g];
      mean[g] = m.mean;
      rstd[g] = 1.0 / std::sqrt(m.m2 / m.count + a.eps);
      for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) {
        const GnBwdChannel kc = gn_bwd_channel<I>(a.weight, a.bias, c, mean[g], rstd[g]);
        k.mh[c] = kc.m_hi;
        k.za[c] = kc.za;
        k.zo[c] = kc.zo;
      }
    }
    have_stats = j;
  }

  // The statistics of sample j to and from arrays shared between passes (mh, za, zo: [C];
  // mean, rstd: [G]), so that a pass after the one that computed them need not merge again.
  void publish(float* mh, float* za, float* zo, double* mean_out, double* rstd_out) const {
    std::copy(k.mh.begin(), k.mh.end(), mh);
    std::copy(k.za.begin(), k.za.end(), za);
    std::copy(k.zo.begin(), k.zo.end(), zo);
    std::copy(mean.begin(), mean.end(), mean_out);
    std::copy(rstd.begin(), rstd.end(), rstd_out);
  }
  void adopt(int64_t j, const float* mh, const float* za, const float* zo, const double* mean_in,
             const double* rstd_in) {
    if (j == have_stats) return;
    std::copy(mh, mh + C, k.mh.begin());
    std::copy(za, za + C, k.za.begin());
    std::copy(zo, zo + C, k.zo.begin());
    std::copy(mean_in, mean_in + G, mean.begin());
    std::copy(rstd_in, rstd_in + G, rstd.begin());
    have_stats = j;
  }

  // After statistics(j): the tiles' sums ([tps, C] each), taken around a float shift per channel
  // (tsh, [tps, C], or mh where null), moved to the sample's mean and added up (tile by tile,
  // channels innermost), then k2 and c3. n >= 0: also stores ds, db and rstd as sample n's.
  template <class I>
  void sums(int64_t j, const double* pds, const double* pdb, const float* tsh, int64_t n) {
    const group_norm_isa::BackwardArgs<T>& a = *args;
    for (int64_t c = 0; c < C; ++c) ds[c] = db[c] = 0.0;
    for (int64_t t = 0; t < tps; ++t) {
      const float* shift = tsh != nullptr ? tsh + t * C : k.mh.data();
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) {
          const double sum_dz = pdb[t * C + c];
          ds[c] += pds[t * C + c] + (static_cast<double>(shift[c]) - mean[g]) * sum_dz;
          db[c] += sum_dz;
        }
      }
    }
    for (int64_t g = 0; g < G; ++g) {
      const int64_t c0 = g * Cg;
      float k2 = 0.f, c3 = 0.f;
      gn_bwd_group_coefficients<I>(a.weight, c0, Cg, static_cast<double>(Cg * S), mean[g], rstd[g], ds.data() + c0,
                                   db.data() + c0, &k2, &c3);
      for (int64_t c = c0; c < c0 + Cg; ++c) {
        k.k2[c] = k2;
        k.c3[c] = c3;
      }
    }
    if (n >= 0) {
      for (int64_t c = 0; c < C; ++c) {
        a.ds[n * C + c] = ds[c];
        a.db[n * C + c] = db[c];
      }
      for (int64_t g = 0; g < G; ++g) a.rstd[n * G + g] = rstd[g];
    }
    have_sums = j;
  }
};

template <class I, Activation A, class T>
void gn_backward_nhwc(const group_norm_isa::BackwardArgs<T>& a, const ParallelFor& pf) {
  const int64_t N = a.d.N, C = a.d.C, G = a.d.G, Cg = C / G, S = a.d.S;
  const int64_t row_bytes = C * static_cast<int64_t>(sizeof(T));
  // Tiles of the forward's rows (x and dy: twice its bytes). Each tile has fixed costs of the order
  // of C per-channel steps (first shifts, folds, the moved sums). With tiles of half these rows,
  // pass 1 alone at (2, 512, 64, 64) took 1.45x the time of a plain read of x and dy, 1.24x now;
  // the whole backward at (2, 640, 32, 32) 2.6-2.7x a copy, 2.4x now (C++ harness, Xeon, 2
  // threads, scratch kept; tiles of twice these rows: 2.5-2.7x there, fewer to share out).
  int64_t tps = 0;
  const int64_t tile_rows = gn_tile_rows(S, row_bytes, &tps);
  // Waves of samples, as in the forward: as many samples as their x and dy fit the L2s of two
  // threads (4 budgets), so that the passes after the first find their tiles in the cache of the
  // thread that read them (the same static partition of the wave's tiles in every pass). Waves of
  // one sample cost more than they save: each pass's tiles are then too few to share out evenly
  // ((2, 320, 32, 32): 3.1x -> 3.8x a copy, + SiLU 5.4-5.6x -> 6.7-6.9x; (4, 320, 32, 32):
  // 2.3x -> 2.6-2.7x; C++ harness, Xeon, 2 threads), so where fewer than two samples fit, one
  // wave of all.
  const int64_t pair_bytes = 2 * S * row_bytes;
  const int64_t fit = 4 * a.cache_budget / gn_max(1, pair_bytes);
  const int64_t wave_samples = fit >= 2 ? gn_min(N, fit) : N;
  constexpr int64_t kVecBytes = I::W * static_cast<int64_t>(sizeof(T));
  // x and dy come from memory: the size above which the output is streamed (where it can be).
  const bool from_memory = N * S * row_bytes >= a.stream_bytes;
  const bool stream = from_memory && row_bytes % kVecBytes == 0 &&
                      reinterpret_cast<uintptr_t>(a.dx) % static_cast<uintptr_t>(kVecBytes) == 0;
  constexpr bool kFused = A == Activation::kNone;
  // Without an activation, long rows from memory are read one at a time in both passes
  // (gn_bwd_row_by_row_moments, gn_bwd_rows_dx).
  const bool one_row = kFused && from_memory && row_bytes >= kGnBwdLongRowBytes;

  // Per tile of a wave (local index t) and channel: the sum of dz * (x - shift) and of dz.
  const size_t wave_tiles = static_cast<size_t>(wave_samples * tps);
  // Pass 2 keeps dz in dx where it can (evaluating the derivative in passes 2 and 3 took 3x the
  // time of the moments pass each at (8, 256, 32, 32) with SiLU).
  const bool keep_dz = gn_bwd_keeps_dz<A>(a, stream);
  GnKept<GnBwdScratch> kept;
  GnBwdScratch& scratch = kept.get();
  double* const pds = gn_at_least(&scratch.pds, wave_tiles * static_cast<size_t>(C));
  double* const pdb = gn_at_least(&scratch.pdb, wave_tiles * static_cast<size_t>(C));
  float* const tsh = kFused ? gn_at_least(&scratch.tsh, wave_tiles * static_cast<size_t>(C)) : nullptr;
  GnMoments* const partial = gn_at_least(&scratch.partial, wave_tiles * static_cast<size_t>(G));
  // With an activation: each wave sample's statistics, as pass 2 computed them, for pass 3.
  std::vector<float> wmh, wza, wzo;
  std::vector<double> wmean, wrstd;
  if constexpr (!kFused) {
    for (auto* v : {&wmh, &wza, &wzo}) v->resize(static_cast<size_t>(wave_samples * C));
    for (auto* v : {&wmean, &wrstd}) v->resize(static_cast<size_t>(wave_samples * G));
  }

  for (int64_t n0 = 0; n0 < N; n0 += wave_samples) {
    const int64_t ns = gn_min(wave_samples, N - n0);
    const int64_t tiles = ns * tps;
    // Tile t of the wave: local sample j, global offset of its first row, rows.
    const auto tile_range = [&](int64_t t, int64_t* j, int64_t* off, int64_t* nr) {
      *j = t / tps;
      const int64_t r0 = (t % tps) * tile_rows;
      *off = ((n0 + *j) * S + r0) * C;
      *nr = gn_min(tile_rows, S - r0);
    };

    // 1. Moments per tile, merged per sample (the forward's algorithm). Without an activation
    // dz = dy does not depend on the statistics, so the channel sums are taken in the same read
    // (gn_nhwc_moments with GnBwdDySums): around the tile's first shifts (tsh), moved to the
    // sample's mean afterwards (sum dy (x - m) = sum dy (x - tsh) + (tsh - m) sum dy; tsh is near m).
    pf(tiles, 1, [&](int64_t begin, int64_t end) {
      GnKept<GnBwdTileScratch> range_kept(C, G, kFused);
      GnBwdTileScratch& rs = range_kept.get();
      for (int64_t t = begin; t < end; ++t) {
        int64_t j = 0, off = 0, nr = 0;
        tile_range(t, &j, &off, &nr);
        if constexpr (kFused) {
          GnBwdDySums<I, T> sums{a.x + off,   a.dy + off,    C,           tsh + t * C, pds + t * C,
                                 pdb + t * C, rs.s3.data(), rs.s4.data(), one_row};
          gn_nhwc_moments<I>(a.x + off, nr, C, G, partial + t * G, &rs.rows, sums);
        } else {
          gn_nhwc_moments<I>(a.x + off, nr, C, G, partial + t * G, &rs.rows);
        }
      }
    });

    // The steps per sample between the passes (merging its tiles' moments, the coefficients of
    // its C channels, moving its tiles' sums) are taken by each range of the next pass for the
    // samples it touches, in parallel: done serially between the passes, they took a third of the
    // time at (2, 1280, 8, 8) (28 of 86 us), which went from 10.5-10.9x to 7.0-8.3x a copy this
    // way, (2, 1280, 16, 16) from 4.0-4.3x to 3.7x (C++ harness, Xeon, 2 threads; results
    // bit-identical). A sample whose tiles several ranges share has these steps done by each of
    // them (C-sized work per range); only the range with its first tile stores its ds, db, rstd.

    // 2. With an activation (dz needs the statistics): channel sums per tile around m_hi, in float
    // lanes over at most kGnMaxBlockRows rows, then double. Last tile first: the end of what pass
    // 1 read is what surely is still in this thread's cache (as the forward's normalization).
    // The range with a sample's first tile publishes its statistics for pass 3.
    if constexpr (!kFused) {
      pf(tiles, 1, [&](int64_t begin, int64_t end) {
        GnKept<GnBwdSampleCoefficients<T>> sample_kept(a, C, G, Cg, S, tps);
        GnBwdSampleCoefficients<T>& sample = sample_kept.get();
        std::vector<float> s1(static_cast<size_t>(C)), s0(static_cast<size_t>(C));
        for (int64_t t = end - 1; t >= begin; --t) {
          int64_t j = 0, off = 0, nr = 0;
          tile_range(t, &j, &off, &nr);
          if (j != sample.have_stats) {
            sample.template statistics<I>(j, partial + j * tps * G);
            if (j * tps >= begin) {
              sample.publish(wmh.data() + j * C, wza.data() + j * C, wzo.data() + j * C, wmean.data() + j * G,
                             wrstd.data() + j * G);
            }
          }
          double* ts1 = pds + t * C;
          double* ts0 = pdb + t * C;
          for (int64_t c = 0; c < C; ++c) ts1[c] = ts0[c] = 0.0;
          for (int64_t b0 = 0; b0 < nr; b0 += kGnMaxBlockRows) {
            const int64_t rows = gn_min(kGnMaxBlockRows, nr - b0);
            for (int64_t c = 0; c < C; ++c) s1[c] = s0[c] = 0.f;
            const int64_t at = off + b0 * C;
            gn_bwd_rows_sums<I, A>(a.x + at, a.dy + at, rows, C, sample.k, s1.data(), s0.data(),
                                   keep_dz ? reinterpret_cast<float*>(a.dx) + at : nullptr);
            for (int64_t c = 0; c < C; ++c) {
              ts1[c] += static_cast<double>(s1[c]);
              ts0[c] += static_cast<double>(s0[c]);
            }
          }
        }
      });
    }

    // 3. dx per tile (first tile first after pass 2, which ended there; last tile first after
    // pass 1), each range with the dx coefficients of its samples. Where dx is not wanted, the
    // same per-sample steps for ds, db and rstd alone, one range per sample.
    const auto sample_sums = [&](GnBwdSampleCoefficients<T>* sample, int64_t j, bool store) {
      if constexpr (kFused) {
        sample->template statistics<I>(j, partial + j * tps * G);
      } else {
        sample->adopt(j, wmh.data() + j * C, wza.data() + j * C, wzo.data() + j * C, wmean.data() + j * G,
                      wrstd.data() + j * G);
      }
      sample->template sums<I>(j, pds + j * tps * C, pdb + j * tps * C, kFused ? tsh + j * tps * C : nullptr,
                               store ? n0 + j : -1);
    };
    if (a.dx == nullptr) {
      pf(ns, 1, [&](int64_t begin, int64_t end) {
        GnKept<GnBwdSampleCoefficients<T>> sample_kept(a, C, G, Cg, S, tps);
        GnBwdSampleCoefficients<T>& sample = sample_kept.get();
        for (int64_t j = begin; j < end; ++j) sample_sums(&sample, j, true);
      });
      continue;
    }
    pf(tiles, 1, [&](int64_t begin, int64_t end) {
      GnKept<GnBwdSampleCoefficients<T>> sample_kept(a, C, G, Cg, S, tps);
      GnBwdSampleCoefficients<T>& sample = sample_kept.get();
      const auto dx_tile = [&](int64_t t) {
        int64_t j = 0, off = 0, nr = 0;
        tile_range(t, &j, &off, &nr);
        if (j != sample.have_sums) sample_sums(&sample, j, j * tps >= begin);
        if (keep_dz) {
          // dz, kept in dx by pass 2 (never streamed): dx = za * dz + k2 * (x - m_hi) + c3 in place.
          gn_bwd_rows_dx<I, Activation::kNone, false>(a.x + off, a.dx + off, a.dx + off, nr, C, sample.k, one_row);
        } else if (stream) {
          gn_bwd_rows_dx<I, A, true>(a.x + off, a.dy + off, a.dx + off, nr, C, sample.k, one_row);
        } else {
          gn_bwd_rows_dx<I, A, false>(a.x + off, a.dy + off, a.dx + off, nr, C, sample.k, one_row);
        }
      };
      if (kFused) {
        for (int64_t t = end - 1; t >= begin; --t) dx_tile(t);
      } else {
        for (int64_t t = begin; t < end; ++t) dx_tile(t);
      }
      if (stream) I::fence();
    });
  }
}

template <class I, class T>
void gn_backward(const group_norm_isa::BackwardArgs<T>& a, const ParallelFor& pf) {
  gn_layout_and_act(a.d, a.act, [&](auto act, bool nhwc) {
    if (nhwc) {
      gn_backward_nhwc<I, decltype(act)::value>(a, pf);
    } else {
      gn_backward_nchw<I, decltype(act)::value>(a, pf);
    }
  });
}

}  // namespace
}  // namespace opbridge
