// MultiScaleDeformableAttention kernels, templated on a SIMD policy S (common/simd_*.h for the
// float types, F64Lanes below for double). Internal header: included once per instruction set
// (ms_deform_attn_cpu.cpp, and ms_deform_attn_cpu_isa.cpp once per instruction set), so
// everything here has internal linkage (see common/simd_avx512.h for why).
//
// Forward, per unit (n, m, q): the taps of the query's L * P samples are built first (element
// offset of the tap's row, and weight = attention weight * bilinear weight; 16 or 8 samples at a
// time with AVX-512 / AVX2), then every tap's D values are accumulated with vector FMAs, D in
// chunks of up to 4 vectors held in registers. Building the next query's taps overlaps gathering
// the current one's. Three variants (msda_forward picks one):
//   packed:  value rearranged per head (contiguous rows + a zero row), for many queries per row
//            (the Deformable-DETR encoder);
//   direct:  value read in place, off-map taps left out (the decoder: few queries per row);
//   large:   direct, one sample at a time with int64 offsets, for values beyond int32 offsets.
//
// Backward, per unit (n, m, level): for each query and sample, the dot products of grad_output
// with the (up to 4) tap rows give the attention-weight and location gradients, and each tap row
// of grad_value gets grad_output * weight added. Units never share a grad_value row (see
// ms_deform_attn.h), so the result is deterministic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common/simd_loop_lanes.h"
#include "ms_deform_attn_isa.h"
#include "opbridge/dtype.h"
#include "opbridge/parallel.h"

namespace opbridge::msda_isa {
namespace {

// double lanes for the float64 kernels: LoopLanes' loops, which the compiler vectorizes for the
// instruction set of the including TU, with loads and stores of double.
struct F64Lanes : LoopLanes<double> {
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

// The large path's samples whose taps are listed at once: 256 taps (3 KB of offsets and
// weights, on the stack). Queries with more samples (L * P > 64) are accumulated block by block.
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

// One tap: acc (K vectors, the last one `tail` lanes when kTail) += w * p[0 ...].
template <class S, int K, bool kTail, class P>
inline void fma_tap(const P* p, typename S::V w, int tail, typename S::V* acc) {
  for (int j = 0; j < K; ++j) {
    if (kTail && j == K - 1) {
      acc[j] = S::fmadd(w, S::load_n(p + j * S::W, tail), acc[j]);
    } else {
      acc[j] = S::fmadd(w, S::load(p + j * S::W), acc[j]);
    }
  }
}

// acc (K vectors, the last one `tail` lanes when kTail) += sum over taps of wt[t] * vb[off[t] ...].
template <class S, class T, int K, bool kTail>
inline void gather(const T* vb, const int64_t* off, const acc_t<T>* wt, int ntaps, int tail,
                   typename S::V* acc) {
  for (int t = 0; t < ntaps; ++t) fma_tap<S, K, kTail>(vb + off[t], S::set1(wt[t]), tail, acc);
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

// A unit (n, m, q) of the forward, q fastest, and its row in the (N, Lq, M) arrays.
struct Unit {
  int64_t n, m, q;
  int64_t nqm(const MsDeformAttnDims& d) const { return (n * d.Lq + q) * d.M + m; }
  Unit next(const MsDeformAttnDims& d) const {
    Unit u = *this;
    if (++u.q == d.Lq) {
      u.q = 0;
      if (++u.m == d.M) {
        u.m = 0;
        ++u.n;
      }
    }
    return u;
  }
  static Unit of(int64_t u, const MsDeformAttnDims& d) {
    const int64_t nm = u / d.Lq;
    return {nm / d.M, nm % d.M, u % d.Lq};
  }
};

// Queries ahead whose locations and weights are prefetched: consecutive queries of a head are
// M * L * P values apart (1 KB and 512 B for Deformable DETR), a stride that defeats the
// hardware prefetchers at every page boundary; 8 queries (a few hundred ns of work each) hide
// the memory latency.
constexpr int64_t kPrefetchUnits = 8;

template <class T>
inline void prefetch_unit(const T* loc, const T* aw, int64_t LP) {
  const char* l = reinterpret_cast<const char*>(loc);
  const char* w = reinterpret_cast<const char*>(aw);
  for (int64_t b = 0; b < LP * 2 * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(l + b);
  for (int64_t b = 0; b < LP * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(w + b);
}

// Queries per parallel task at the least: about 64 KB of gathered values (a task of a few
// microseconds at the least, so that the pool's per-task cost stays small).
int64_t forward_grain(int64_t taps_per_query, int64_t D) {
  return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, taps_per_query * D));
}

// ---- forward, packed path ---------------------------------------------------------------
//
// value is first rearranged into packed[n][m][s][d] (in the accumulation type), one head's rows
// contiguous and followed by a row of zeros. Two things come of it: a head's rows are one block
// that stays in cache while its queries are sampled (in (N, S, M, D) they are D elements out of
// every M * D, a stride that maps them onto few cache sets), and a tap off the map can read the
// zero row with weight 0 instead of being left out, so every query has 4 * L * P taps in fixed
// places, built without branches (off-map taps add exactly 0; on-map taps still multiply their
// value, so NaN values propagate as in the direct path).

// Whether the packed path pays: the rearrangement reads and writes value once, which pays when
// a head's queries gather many times as many rows as the head has. Measured (2026-11, Xeon,
// AVX-512, D = 32): a Deformable-DETR encoder call (64 taps per row) runs 2x faster packed, a
// decoder call (300 queries: 3.5 taps per row) 2x faster direct; the crossover is put between,
// at 16. Tap offsets are int32 element offsets (row * D), computed also for off-map taps before
// they are discarded: (2 S + 2) * D must fit.
inline bool use_packed(const MsDeformAttnDims& d) {
  return d.S < (int64_t{1} << 30) && (2 * d.S + 2) * d.D < (int64_t{1} << 31) &&
         d.Lq * d.L * d.P * 4 >= 16 * d.S;
}

// Copies n elements of T to A (converting the 16-bit types) with vector loads and stores.
template <class S, class T>
inline void to_acc(const T* src, acc_t<T>* dst, int64_t n) {
  int64_t i = 0;
  for (; i + S::W <= n; i += S::W) S::store(dst + i, S::load(src + i));
  if (i < n) S::store_n(dst + i, S::load_n(src + i, static_cast<int>(n - i)), static_cast<int>(n - i));
}

// Per-sample level data of the packed path (indexed by sample l * P + p).
template <class A>
struct SampleLevels {
  std::vector<A> wf, hf;                // W and H as A
  std::vector<int32_t> W, H, start;     // width, height, first row
  std::vector<int32_t> start_x_stride;  // first row * the row stride of the offsets
};

// The per-sample level data for offsets in units of `stride` elements per row, padded so that
// vector loads of the last samples stay in bounds (the padding is never used).
template <class A>
SampleLevels<A> sample_levels(const int64_t* spatial_shapes, const int64_t* level_start_index,
                              const MsDeformAttnDims& d, int32_t stride) {
  const int64_t LP = d.L * d.P;
  SampleLevels<A> lv;
  const size_t padded = static_cast<size_t>(LP + 16);
  lv.wf.assign(padded, A(1));
  lv.hf.assign(padded, A(1));
  lv.W.assign(padded, 1);
  lv.H.assign(padded, 1);
  lv.start.assign(padded, 0);
  lv.start_x_stride.assign(padded, 0);
  for (int64_t s = 0; s < LP; ++s) {
    const int64_t l = s / d.P;
    lv.H[s] = static_cast<int32_t>(spatial_shapes[2 * l]);
    lv.W[s] = static_cast<int32_t>(spatial_shapes[2 * l + 1]);
    lv.hf[s] = static_cast<A>(lv.H[s]);
    lv.wf[s] = static_cast<A>(lv.W[s]);
    lv.start[s] = static_cast<int32_t>(level_start_index[l]);
    lv.start_x_stride[s] = static_cast<int32_t>(level_start_index[l] * stride);
  }
  return lv;
}

// Whether value itself can be addressed with int32 element offsets (row * M * D), also for the
// off-map taps computed before they are dropped: (2 S + 2) * M * D must fit.
inline bool direct_offsets_fit(const MsDeformAttnDims& d) {
  return d.S < (int64_t{1} << 30) && (2 * d.S + 2) * d.M * d.D < (int64_t{1} << 31);
}

// The taps of samples [s0, s1) of one query as (element offset, weight) pairs: offset = row of
// the tap * stride (D for the packed rows, M * D for value itself), weight = attention weight *
// bilinear weight. Two layouts:
//   kCompact = false: 4 * LP pairs, tap-major (tap k of sample s at k * LP + s); off-map taps get
//                     (zero_off, 0) -- the packed path's zero row.
//   kCompact = true:  only the on-map taps, appended at offs[n], wts[n] in order; returns the new n
//                     (value read in place has no zero row to point to).
// The scalar form; build_taps below does the same 16 (AVX-512) or 8 (AVX2) samples at a time,
// identical up to the rounding of x * W - 0.5 (which the vector forms fuse).
template <bool kCompact, class A>
inline int64_t build_taps_scalar(const A* loc, const A* aw, int64_t LP, int64_t s0, int64_t s1,
                                 const SampleLevels<A>& lv, int32_t stride, int32_t zero_off, int32_t* offs, A* wts,
                                 int64_t n) {
  for (int64_t s = s0; s < s1; ++s) {
    const A wf = lv.wf[s], hf = lv.hf[s];
    A x = loc[2 * s] * wf - A(0.5);
    A y = loc[2 * s + 1] * hf - A(0.5);
    // NaN fails every comparison: such a sample is not inside.
    const bool in = x > A(-1) && x < wf && y > A(-1) && y < hf;
    x = in ? x : A(0);  // keeps the conversions below defined for NaN / inf / huge coordinates
    y = in ? y : A(0);
    const A x0f = std::floor(x), y0f = std::floor(y);
    const A fx = x - x0f, fy = y - y0f, gx = A(1) - fx, gy = A(1) - fy;
    const int64_t x0 = static_cast<int64_t>(x0f), y0 = static_cast<int64_t>(y0f);
    const int64_t w = lv.W[s], h = lv.H[s];
    // x0 >= -1 when inside; the upper bounds are checked in integers (W as A may round up).
    const bool xl = in && x0 >= 0 && x0 < w, xh = in && x0 + 1 < w;
    const bool yl = y0 >= 0 && y0 < h, yh = y0 + 1 < h;
    const A a = aw[s];
    const int64_t pix = lv.start[s] + y0 * w + x0;
    const bool on[4] = {xl && yl, xh && yl, xl && yh, xh && yh};
    const int64_t rows[4] = {pix, pix + 1, pix + w, pix + w + 1};
    const A bw[4] = {gy * gx, gy * fx, fy * gx, fy * fx};
    for (int k = 0; k < 4; ++k) {
      if constexpr (kCompact) {
        if (on[k]) {
          offs[n] = static_cast<int32_t>(rows[k] * stride);
          wts[n] = a * bw[k];
          ++n;
        }
      } else {
        offs[k * LP + s] = on[k] ? static_cast<int32_t>(rows[k] * stride) : zero_off;
        wts[k * LP + s] = on[k] ? a * bw[k] : A(0);
      }
    }
  }
  return kCompact ? n : 4 * LP;
}

// All LP samples of a query (see build_taps_scalar), 16 (AVX-512) or 8 (AVX2) samples per step
// where this TU is compiled for them: the per-sample arithmetic (about 60 scalar instructions)
// would otherwise cost more than gathering the taps. int32 lanes throughout (see use_packed and
// direct_offsets_fit): offsets of off-map taps may wrap around in the vector multiplies; they
// are replaced or dropped before use. Returns the number of taps written.
template <bool kCompact, class A>
inline int64_t build_taps(const A* loc, const A* aw, int64_t LP, const SampleLevels<A>& lv, int32_t stride,
                          int32_t zero_off, int32_t* offs, A* wts) {
  int64_t s = 0, n = 0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  if constexpr (std::is_same_v<A, float>) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512 half = _mm512_set1_ps(0.5f), minus1 = _mm512_set1_ps(-1.f), one = _mm512_set1_ps(1.f);
    const __m512i zero_i = _mm512_setzero_si512(), one_i = _mm512_set1_epi32(1), dv = _mm512_set1_epi32(stride);
    const __m512i zoff = _mm512_set1_epi32(zero_off);
    for (; s + 16 <= LP; s += 16) {
      const __m512 l0 = _mm512_loadu_ps(loc + 2 * s), l1 = _mm512_loadu_ps(loc + 2 * s + 16);
      const __m512 wf = _mm512_loadu_ps(lv.wf.data() + s), hf = _mm512_loadu_ps(lv.hf.data() + s);
      __m512 x = _mm512_fmsub_ps(_mm512_permutex2var_ps(l0, even, l1), wf, half);
      __m512 y = _mm512_fmsub_ps(_mm512_permutex2var_ps(l0, odd, l1), hf, half);
      const __mmask16 in = _mm512_cmp_ps_mask(x, minus1, _CMP_GT_OQ) & _mm512_cmp_ps_mask(x, wf, _CMP_LT_OQ) &
                           _mm512_cmp_ps_mask(y, minus1, _CMP_GT_OQ) & _mm512_cmp_ps_mask(y, hf, _CMP_LT_OQ);
      x = _mm512_maskz_mov_ps(in, x);
      y = _mm512_maskz_mov_ps(in, y);
      const __m512 x0f = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
      const __m512 y0f = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
      const __m512 fx = _mm512_sub_ps(x, x0f), fy = _mm512_sub_ps(y, y0f);
      const __m512 gx = _mm512_sub_ps(one, fx), gy = _mm512_sub_ps(one, fy);
      const __m512i x0 = _mm512_cvttps_epi32(x0f), y0 = _mm512_cvttps_epi32(y0f);
      const __m512i w = _mm512_loadu_si512(lv.W.data() + s), h = _mm512_loadu_si512(lv.H.data() + s);
      const __m512i x1 = _mm512_add_epi32(x0, one_i), y1 = _mm512_add_epi32(y0, one_i);
      const __mmask16 xl = in & _mm512_cmpge_epi32_mask(x0, zero_i) & _mm512_cmplt_epi32_mask(x0, w);
      const __mmask16 xh = in & _mm512_cmplt_epi32_mask(x1, w);
      const __mmask16 yl = _mm512_cmpge_epi32_mask(y0, zero_i) & _mm512_cmplt_epi32_mask(y0, h);
      const __mmask16 yh = _mm512_cmplt_epi32_mask(y1, h);
      const __m512 a = _mm512_loadu_ps(aw + s);
      // Offsets: start * stride + y0 * (W * stride) + x0 * stride, the two products independent.
      const __m512i wd = _mm512_mullo_epi32(w, dv);
      const __m512i o00 = _mm512_add_epi32(_mm512_add_epi32(_mm512_loadu_si512(lv.start_x_stride.data() + s),
                                                            _mm512_mullo_epi32(y0, wd)),
                                           _mm512_mullo_epi32(x0, dv));
      const __m512i o01 = _mm512_add_epi32(o00, dv);
      const __m512i o10 = _mm512_add_epi32(o00, wd);
      const __m512i o11 = _mm512_add_epi32(o10, dv);
      const __mmask16 m[4] = {static_cast<__mmask16>(xl & yl), static_cast<__mmask16>(xh & yl),
                              static_cast<__mmask16>(xl & yh), static_cast<__mmask16>(xh & yh)};
      const __m512i o[4] = {o00, o01, o10, o11};
      const __m512 bw[4] = {_mm512_mul_ps(gy, gx), _mm512_mul_ps(gy, fx), _mm512_mul_ps(fy, gx),
                            _mm512_mul_ps(fy, fx)};
      for (int k = 0; k < 4; ++k) {
        if constexpr (kCompact) {
          _mm512_mask_compressstoreu_epi32(offs + n, m[k], o[k]);
          _mm512_mask_compressstoreu_ps(wts + n, m[k], _mm512_mul_ps(a, bw[k]));
          n += __builtin_popcount(static_cast<unsigned>(m[k]));
        } else {
          _mm512_storeu_si512(offs + k * LP + s, _mm512_mask_blend_epi32(m[k], zoff, o[k]));
          _mm512_storeu_ps(wts + k * LP + s, _mm512_maskz_mul_ps(m[k], a, bw[k]));
        }
      }
    }
  }
#elif defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<A, float>) {
    const __m256 half = _mm256_set1_ps(0.5f), minus1 = _mm256_set1_ps(-1.f), one = _mm256_set1_ps(1.f);
    const __m256i minus1_i = _mm256_set1_epi32(-1), one_i = _mm256_set1_epi32(1), dv = _mm256_set1_epi32(stride);
    const __m256i zoff = _mm256_set1_epi32(zero_off);
    const auto blend_i = [](__m256i if_false, __m256i if_true, __m256 mask) {
      return _mm256_castps_si256(
          _mm256_blendv_ps(_mm256_castsi256_ps(if_false), _mm256_castsi256_ps(if_true), mask));
    };
    const auto as_ps = [](__m256i v) { return _mm256_castsi256_ps(v); };
    for (; s + 8 <= LP; s += 8) {
      const __m256 l0 = _mm256_loadu_ps(loc + 2 * s), l1 = _mm256_loadu_ps(loc + 2 * s + 8);
      // (x0 y0 x1 y1 | x2 y2 x3 y3), (x4 ... | ...) -> x0 x1 x4 x5 | x2 x3 x6 x7 -> x0 .. x7
      const __m256 xs = _mm256_castpd_ps(_mm256_permute4x64_pd(
          _mm256_castps_pd(_mm256_shuffle_ps(l0, l1, _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0)));
      const __m256 ys = _mm256_castpd_ps(_mm256_permute4x64_pd(
          _mm256_castps_pd(_mm256_shuffle_ps(l0, l1, _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0)));
      const __m256 wf = _mm256_loadu_ps(lv.wf.data() + s), hf = _mm256_loadu_ps(lv.hf.data() + s);
      __m256 x = _mm256_fmsub_ps(xs, wf, half);
      __m256 y = _mm256_fmsub_ps(ys, hf, half);
      const __m256 in = _mm256_and_ps(
          _mm256_and_ps(_mm256_cmp_ps(x, minus1, _CMP_GT_OQ), _mm256_cmp_ps(x, wf, _CMP_LT_OQ)),
          _mm256_and_ps(_mm256_cmp_ps(y, minus1, _CMP_GT_OQ), _mm256_cmp_ps(y, hf, _CMP_LT_OQ)));
      x = _mm256_and_ps(x, in);
      y = _mm256_and_ps(y, in);
      const __m256 x0f = _mm256_floor_ps(x), y0f = _mm256_floor_ps(y);
      const __m256 fx = _mm256_sub_ps(x, x0f), fy = _mm256_sub_ps(y, y0f);
      const __m256 gx = _mm256_sub_ps(one, fx), gy = _mm256_sub_ps(one, fy);
      const __m256i x0 = _mm256_cvttps_epi32(x0f), y0 = _mm256_cvttps_epi32(y0f);
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lv.W.data() + s));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lv.H.data() + s));
      const __m256i x1 = _mm256_add_epi32(x0, one_i), y1 = _mm256_add_epi32(y0, one_i);
      // a < b as a lane mask: b > a.
      const __m256 xl = _mm256_and_ps(in, as_ps(_mm256_and_si256(_mm256_cmpgt_epi32(x0, minus1_i),
                                                                   _mm256_cmpgt_epi32(w, x0))));
      const __m256 xh = _mm256_and_ps(in, as_ps(_mm256_cmpgt_epi32(w, x1)));
      const __m256 yl = as_ps(_mm256_and_si256(_mm256_cmpgt_epi32(y0, minus1_i), _mm256_cmpgt_epi32(h, y0)));
      const __m256 yh = as_ps(_mm256_cmpgt_epi32(h, y1));
      const __m256 a = _mm256_loadu_ps(aw + s);
      const __m256i wd = _mm256_mullo_epi32(w, dv);
      const __m256i o00 = _mm256_add_epi32(
          _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lv.start_x_stride.data() + s)),
                           _mm256_mullo_epi32(y0, wd)),
          _mm256_mullo_epi32(x0, dv));
      const __m256i o01 = _mm256_add_epi32(o00, dv);
      const __m256i o10 = _mm256_add_epi32(o00, wd);
      const __m256i o11 = _mm256_add_epi32(o10, dv);
      const __m256 m[4] = {_mm256_and_ps(xl, yl), _mm256_and_ps(xh, yl), _mm256_and_ps(xl, yh),
                           _mm256_and_ps(xh, yh)};
      const __m256i o[4] = {o00, o01, o10, o11};
      const __m256 bw[4] = {_mm256_mul_ps(gy, gx), _mm256_mul_ps(gy, fx), _mm256_mul_ps(fy, gx),
                            _mm256_mul_ps(fy, fx)};
      for (int k = 0; k < 4; ++k) {
        if constexpr (kCompact) {
          // No compress instruction in AVX2: the lanes go out through a small buffer.
          alignas(32) int32_t ob[8];
          alignas(32) float wb[8];
          _mm256_store_si256(reinterpret_cast<__m256i*>(ob), o[k]);
          _mm256_store_ps(wb, _mm256_mul_ps(a, bw[k]));
          for (unsigned bits = static_cast<unsigned>(_mm256_movemask_ps(m[k])); bits != 0; bits &= bits - 1) {
            const int lane = __builtin_ctz(bits);
            offs[n] = ob[lane];
            wts[n] = wb[lane];
            ++n;
          }
        } else {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(offs + k * LP + s), blend_i(zoff, o[k], m[k]));
          // and-ing with the mask zeroes the weight (a NaN attention weight included).
          _mm256_storeu_ps(wts + k * LP + s, _mm256_and_ps(m[k], _mm256_mul_ps(a, bw[k])));
        }
      }
    }
  }
#endif
  return build_taps_scalar<kCompact>(loc, aw, LP, s, LP, lv, stride, zero_off, offs, wts, n);
}

// out[0, K * W) (the last vector `tail` lanes when kTail) = sum_t wts[t] * head[offs[t] ...].
// Consecutive taps go to U independent sets of accumulators, added up at the end: with one set,
// every tap's multiply-add would wait for the previous one's (4 cycles), which bounds the loop
// far below what the loads allow. U * K <= 8 accumulators fit the AVX2 register file too.
template <class S, class T, class H, int K, bool kTail>
inline void gather_rows(const H* head, const int32_t* offs, const acc_t<T>* wts, int64_t ntaps, int tail, T* out) {
  using V = typename S::V;
  constexpr int U = K <= 2 ? 4 : 2;
  V acc[U][K];
  for (int u = 0; u < U; ++u) {
    for (int j = 0; j < K; ++j) acc[u][j] = S::zero();
  }
  const auto tap = [&](int64_t t, V* a) { fma_tap<S, K, kTail>(head + offs[t], S::set1(wts[t]), tail, a); };
  int64_t t = 0;
  for (; t + U <= ntaps; t += U) {
    for (int u = 0; u < U; ++u) tap(t + u, acc[u]);
  }
  for (; t < ntaps; ++t) tap(t, acc[0]);
  for (int j = 0; j < K; ++j) {
    for (int u = 1; u < U; ++u) acc[0][j] = S::add(acc[0][j], acc[u][j]);
    if (kTail && j == K - 1) {
      S::store_n(out + j * S::W, acc[0][j], tail);
    } else {
      S::store(out + j * S::W, acc[0][j]);
    }
  }
}

// gather_rows over all of D: chunks of up to kMaxVectors vectors. head: the rows' base (the
// packed head, or value itself for the direct path: H = T).
template <class S, class T, class H>
void gather_all(const H* head, int64_t D, const int32_t* offs, const acc_t<T>* wts, int64_t ntaps, T* out) {
  constexpr int W = S::W;
  int64_t d0 = 0;
  for (; D - d0 >= kMaxVectors * W; d0 += kMaxVectors * W) {
    gather_rows<S, T, H, kMaxVectors, false>(head + d0, offs, wts, ntaps, W, out + d0);
  }
  const int64_t rem = D - d0;
  if (rem == 0) return;
  const int k = static_cast<int>((rem + W - 1) / W);
  const int tail = static_cast<int>(rem - (k - 1) * W);
#define OPBRIDGE_MSDA_GATHER(K)                                                            \
  case K:                                                                                  \
    if (tail == W) {                                                                       \
      gather_rows<S, T, H, K, false>(head + d0, offs, wts, ntaps, tail, out + d0);         \
    } else {                                                                               \
      gather_rows<S, T, H, K, true>(head + d0, offs, wts, ntaps, tail, out + d0);          \
    }                                                                                      \
    break;
  switch (k) {
    OPBRIDGE_MSDA_GATHER(1)
    OPBRIDGE_MSDA_GATHER(2)
    OPBRIDGE_MSDA_GATHER(3)
    default: OPBRIDGE_MSDA_GATHER(4)
  }
#undef OPBRIDGE_MSDA_GATHER
}

// One parallel task's units [begin, end) of a forward path (value read packed or in place),
// software pipelined: the taps of unit u + 1 are built while unit u gathers, from two buffers.
// Read right after build_taps wrote them with wide vector stores, each tap's offset and weight
// would wait for store forwarding (which fails from a 64-byte store to a 4-byte load at most
// offsets): that wait was half the time of a call. The unit kPrefetchUnits ahead has its
// locations and weights prefetched. gather(unit, offs, wts, ntaps) gathers one unit's taps.
template <bool kCompact, class S, class T, class Gather>
void sample_units(const FwdArgs<T>& a, const SampleLevels<acc_t<T>>& lv, int32_t stride, int32_t zero_off,
                  int64_t begin, int64_t end, const Gather& gather) {
  using A = acc_t<T>;
  const MsDeformAttnDims& d = a.d;
  const int64_t LP = d.L * d.P;
  const int64_t units = d.N * d.M * d.Lq;
  const size_t taps = static_cast<size_t>(4 * LP);
  std::vector<int32_t> offs(2 * taps);
  std::vector<A> wts(2 * taps);
  int64_t count[2] = {0, 0};
  std::vector<A> conv(std::is_same_v<T, A> ? 0 : static_cast<size_t>(3 * LP));
  const auto build = [&](int64_t u, const Unit& un, const Unit& ahead) {
    const int64_t nqm = un.nqm(d);
    if (u + kPrefetchUnits < end) {
      const int64_t far = ahead.nqm(d);
      prefetch_unit(a.sampling_locations + far * LP * 2, a.attention_weights + far * LP, LP);
    }
    const A* loc;
    const A* aw;
    if constexpr (std::is_same_v<T, A>) {
      loc = a.sampling_locations + nqm * LP * 2;
      aw = a.attention_weights + nqm * LP;
    } else {
      to_acc<S, T>(a.sampling_locations + nqm * LP * 2, conv.data(), 2 * LP);
      to_acc<S, T>(a.attention_weights + nqm * LP, conv.data() + 2 * LP, LP);
      loc = conv.data();
      aw = conv.data() + 2 * LP;
    }
    const size_t buf = static_cast<size_t>(u & 1) * taps;
    count[u & 1] = build_taps<kCompact>(loc, aw, LP, lv, stride, zero_off, offs.data() + buf, wts.data() + buf);
  };
  // The unit being gathered, the one being built (next) and the one prefetched (ahead).
  Unit cur = Unit::of(begin, d), ahead = Unit::of(std::min(begin + kPrefetchUnits, units - 1), d);
  build(begin, cur, ahead);
  for (int64_t u = begin; u < end; ++u) {
    const Unit next = cur.next(d);
    ahead = ahead.next(d);
    if (u + 1 < end) build(u + 1, next, ahead);
    const size_t buf = static_cast<size_t>(u & 1) * taps;
    gather(cur, offs.data() + buf, wts.data() + buf, count[u & 1]);
    cur = next;
  }
}

// A forward path's sampling over the thread pool: every unit's taps (sample_units) gathered from
// head(unit), the first element of the unit's head in value or in its packed copy, into the
// output. Compact taps leave the off-map ones out; otherwise a unit has all 4 * L * P.
template <bool kCompact, class S, class T, class Head>
void sample_and_gather(const FwdArgs<T>& a, const ParallelFor& pf, const SampleLevels<acc_t<T>>& lv, int32_t stride,
                       int32_t zero_off, const Head& head) {
  const MsDeformAttnDims& d = a.d;
  const int64_t taps = 4 * d.L * d.P;
  pf(d.N * d.M * d.Lq, forward_grain(taps, d.D), [&](int64_t begin, int64_t end) {
    sample_units<kCompact, S>(a, lv, stride, zero_off, begin, end,
                              [&](const Unit& u, const int32_t* offs, const acc_t<T>* wts, int64_t ntaps) {
                                gather_all<S, T>(head(u), d.D, offs, wts, kCompact ? ntaps : taps,
                                                 a.output + u.nqm(d) * d.D);
                              });
  });
}

template <class S, class T>
void msda_forward_packed(const FwdArgs<T>& a, const ParallelFor& pf) {
  using A = acc_t<T>;
  const MsDeformAttnDims& d = a.d;
  const int64_t row = d.M * d.D;
  const int64_t head_rows = d.S + 1;  // the head's rows and its zero row
  const int64_t head_size = head_rows * d.D;
  // 64-byte aligned, so that a row of 16 floats is one cache line and vector loads never split
  // lines (new[] gives 16 bytes: half the time of the gather went to split loads); not
  // value-initialized (every element is written below: zeroing would cost a pass).
  struct AlignedFree {
    void operator()(A* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<A[], AlignedFree> packed(static_cast<A*>(
      ::operator new[](static_cast<size_t>(d.N * d.M * head_size) * sizeof(A), std::align_val_t{64})));
  // 1. Rearrange: value[n, s, :, :] is read contiguously (a block of rows per task) and
  //    scattered into the M heads' blocks.
  constexpr int64_t kRowsPerTask = 64;
  const int64_t blocks = (d.S + kRowsPerTask - 1) / kRowsPerTask;
  pf(d.N * blocks, std::max<int64_t>(1, 16 / std::max<int64_t>(1, row / 256)), [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t n = u / blocks, s0 = (u % blocks) * kRowsPerTask, s1 = std::min(d.S, s0 + kRowsPerTask);
      for (int64_t s = s0; s < s1; ++s) {
        const T* src = a.value + (n * d.S + s) * row;
        for (int64_t m = 0; m < d.M; ++m) {
          to_acc<S, T>(src + m * d.D, packed.get() + (n * d.M + m) * head_size + s * d.D, d.D);
        }
      }
    }
  });
  for (int64_t h = 0; h < d.N * d.M; ++h) std::fill_n(packed.get() + h * head_size + d.S * d.D, d.D, A(0));

  // 2. Per-sample level data, shared by every query.
  const SampleLevels<A> lv = sample_levels<A>(a.spatial_shapes, a.level_start_index, d, static_cast<int32_t>(d.D));
  const int32_t D32 = static_cast<int32_t>(d.D);
  const int32_t zero_off = static_cast<int32_t>(d.S * d.D);

  // 3. Sample (sample_units): unit u = (n, m, q), q fastest, so that a task's queries share
  //    heads; every unit has 4 * L * P taps (off-map ones read the zero row).
  sample_and_gather<false, S>(a, pf, lv, D32, zero_off,
                              [&](const Unit& u) { return packed.get() + (u.n * d.M + u.m) * head_size; });
}

// ---- forward, direct path (few queries per head: value read in place) ---------------------
//
// As the packed path's sampling step, with the taps addressing value's own rows (offset row * M
// * D from the head's first element) and off-map taps left out (compact taps: value has no zero
// row).
template <class S, class T>
void msda_forward_direct(const FwdArgs<T>& a, const ParallelFor& pf) {
  using A = acc_t<T>;
  const MsDeformAttnDims& d = a.d;
  const int64_t row = d.M * d.D;
  const SampleLevels<A> lv = sample_levels<A>(a.spatial_shapes, a.level_start_index, d, static_cast<int32_t>(row));
  sample_and_gather<true, S>(a, pf, lv, static_cast<int32_t>(row), 0,
                             [&](const Unit& u) { return a.value + u.n * d.S * row + u.m * d.D; });
}

// The direct path for values too large for int32 offsets (more than 2^30 elements per batch
// element): one sample at a time, int64 offsets, samples in blocks of kBlockSamples.
template <class S, class T>
void msda_forward_direct_large(const FwdArgs<T>& a, const ParallelFor& pf);

template <class S, class T>
void msda_forward(const FwdArgs<T>& a, const ParallelFor& pf) {
  const MsDeformAttnDims& d = a.d;
  if (d.N == 0 || d.Lq == 0 || d.M == 0 || d.D == 0) return;  // empty output
  if (d.L * d.P > 0 && use_packed(d)) {
    msda_forward_packed<S, T>(a, pf);
  } else if (direct_offsets_fit(d)) {
    msda_forward_direct<S, T>(a, pf);
  } else {
    msda_forward_direct_large<S, T>(a, pf);
  }
}

template <class S, class T>
void msda_forward_direct_large(const FwdArgs<T>& a, const ParallelFor& pf) {
  using A = acc_t<T>;
  const MsDeformAttnDims& d = a.d;
  const int64_t LP = d.L * d.P;
  const int64_t row = d.M * d.D;  // value's stride along S
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
template <class S, class G, class T>
inline void dot4(const G* go, const T* const* rows, int64_t D, double* dot) {
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
  const MsDeformAttnDims& d = a.d;
  const int64_t row = d.M * d.D;
  const int64_t LP = d.L * d.P;
  if (d.N == 0 || d.M == 0) return;  // every output is empty
  Level<A> lv[kMsDeformAttnMaxLevels];
  load_levels(a.spatial_shapes, a.level_start_index, d.L, lv);
  const bool want_dots = a.grad_sampling_locations != nullptr || a.grad_attention_weights != nullptr;
  const bool want_value = a.grad_value != nullptr && d.D > 0;
  const int64_t units = d.N * d.M * d.L;
  // Unit (n, m, l): the level's value rows of head m are copied into a contiguous buffer (in the
  // accumulation type) and grad_value is accumulated in another, written back once: in place,
  // a head's rows are D elements out of every M * D, a stride that maps them onto few cache sets
  // (as in the forward's packed path), and the 16-bit types need a float accumulator anyway.
  pf(units, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> vbuf, gbuf, go(static_cast<size_t>(d.D));
    for (int64_t u = begin; u < end; ++u) {
      const int64_t l = u % d.L;
      const int64_t nm = u / d.L;
      const int64_t m = nm % d.M, n = nm / d.M;
      const Level<A>& lev = lv[l];
      const int64_t hw = lev.H * lev.W;
      const T* vhead = a.value + (n * d.S + lev.start) * row + m * d.D;  // row i of the level: vhead + i * row
      // The copy pays when the level's rows are tapped at least once each on average (not for a
      // few hundred decoder queries over a 64 x 64 map): otherwise the rows are read in place.
      const bool copy_rows = want_dots && d.Lq * d.P * 4 >= hw;
      if (copy_rows) {
        vbuf.resize(static_cast<size_t>(hw * d.D));
        for (int64_t i = 0; i < hw; ++i) to_acc<S, T>(vhead + i * row, vbuf.data() + i * d.D, d.D);
      }
      if (want_value) gbuf.assign(static_cast<size_t>(hw * d.D), A(0));
      for (int64_t q = 0; q < d.Lq && (want_dots || want_value); ++q) {
        const int64_t nqm = (n * d.Lq + q) * d.M + m;
        const int64_t first = nqm * LP + l * d.P;  // sample index of (n, q, m, l, 0)
        if (q + kPrefetchUnits < d.Lq) {
          // Consecutive queries are M * L * P samples apart: prefetch as in the forward.
          const int64_t ahead = nqm + kPrefetchUnits * d.M;
          const int64_t far = ahead * LP + l * d.P;
          prefetch_unit(a.sampling_locations + far * 2, a.attention_weights + far, d.P);
          prefetch_unit(a.grad_output + ahead * d.D, a.grad_output + ahead * d.D, (d.D + 1) / 2);
          if (a.grad_sampling_locations != nullptr) __builtin_prefetch(a.grad_sampling_locations + far * 2, 1);
          if (a.grad_attention_weights != nullptr) __builtin_prefetch(a.grad_attention_weights + far, 1);
        }
        const T* loc = a.sampling_locations + first * 2;
        const T* aw = a.attention_weights + first;
        T* gloc = a.grad_sampling_locations != nullptr ? a.grad_sampling_locations + first * 2 : nullptr;
        T* gaw = a.grad_attention_weights != nullptr ? a.grad_attention_weights + first : nullptr;
        bool have_go = false;
        for (int64_t p = 0; p < d.P; ++p) {
          const Sample<A> s = locate(static_cast<A>(to_float(loc[2 * p])), static_cast<A>(to_float(loc[2 * p + 1])), lev);
          if (!s.inside) {
            if (gloc != nullptr) gloc[2 * p] = gloc[2 * p + 1] = from_acc<T>(A(0));
            if (gaw != nullptr) gaw[p] = from_acc<T>(A(0));
            continue;
          }
          if (!have_go) {  // the query's grad_output row, once per query that has an inside sample
            to_acc<S, T>(a.grad_output + nqm * d.D, go.data(), d.D);
            have_go = true;
          }
          const A w = static_cast<A>(to_float(aw[p]));
          const bool on[4] = {s.t00, s.t01, s.t10, s.t11};
          // Rows within the level (pixel - start): on-map taps only.
          const int64_t pix0 = s.pix - lev.start;
          const int64_t pix[4] = {pix0, pix0 + 1, pix0 + lev.W, pix0 + lev.W + 1};
          const A gx = A(1) - s.fx, gy = A(1) - s.fy;
          const A bw[4] = {gy * gx, gy * s.fx, s.fy * gx, s.fy * s.fx};
          if (want_dots) {
            // Off-map taps read some valid row (the level's first) and their dots are dropped.
            double dot[4];
            if (copy_rows) {
              const A* rows[4];
              for (int k = 0; k < 4; ++k) rows[k] = vbuf.data() + (on[k] ? pix[k] : 0) * d.D;
              dot4<S>(go.data(), rows, d.D, dot);
            } else {
              const T* rows[4];
              for (int k = 0; k < 4; ++k) rows[k] = vhead + (on[k] ? pix[k] : 0) * row;
              dot4<S>(go.data(), rows, d.D, dot);
            }
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
          if (want_value) {
            for (int k = 0; k < 4; ++k) {
              if (on[k]) axpy<S, A>(gbuf.data() + pix[k] * d.D, w * bw[k], go.data(), d.D);
            }
          }
        }
      }
      if (want_value) {
        T* ghead = a.grad_value + (n * d.S + lev.start) * row + m * d.D;
        for (int64_t i = 0; i < hw; ++i) {
          const A* src = gbuf.data() + i * d.D;
          T* dst = ghead + i * row;
          int64_t d0 = 0;
          for (; d0 + S::W <= d.D; d0 += S::W) S::store(dst + d0, S::load(src + d0));
          if (d0 < d.D) S::store_n(dst + d0, S::load_n(src + d0, static_cast<int>(d.D - d0)), static_cast<int>(d.D - d0));
        }
      }
    }
  });
}

}  // namespace
}  // namespace opbridge::msda_isa
