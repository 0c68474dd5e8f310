// GroupNorm forward written once over a SIMD wrapper (cpp/common/simd_*.h) and compiled once per
// instruction set (internal header; linkage as explained in simd_avx512.h).
//
// Memory traffic is the cost: per (n, g) group, X is read from memory once, for the statistics,
// in blocks small enough to stay in L1; the normalization then reads the group again from L2
// (a group of the common conv shapes is 25-256 KB) and writes Y once.
//
// Statistics: each block of kBlock elements is summed as deviations d = x - shift in float
// lanes (sum d and sum d^2 in one pass), folded into double, and merged into the group's
// running (count, mean, M2) with Chan's parallel formula in double. The shift is the group's
// running mean (the first element for the first block), so a large common offset (mean 1e6,
// unit variance) never enters the float sums; a block whose own mean lies further from the
// shift than its spread is summed once more around its mean while it is still in L1, so
// sum d^2 - (sum d)^2 / n never cancels more than half its digits. A constant group gives
// d = 0 exactly: mean exact, variance exactly 0.
//
// Normalization: y = (x - m_hi) * a_c + (b_c - m_lo * a_c), with the mean split into float
// m_hi + m_lo: x - m_hi is exact near a large mean, where the usual x * a + (b - mean * a)
// would round the offset to float and lose the output's digits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstddef>

#include "group_norm_isa.h"
#include "opbridge/parallel.h"

namespace opbridge {
namespace {

// Elements per statistics block: 16 KB of float (8 KB of 16-bit) sits in any L1 for the
// occasional second pass, and each float lane sums at most kBlock / (4 * W) <= 128 terms, so its
// rounding error stays far below float epsilon * |sum|.
constexpr int64_t kGnBlock = 4096;
// Smallest amount of work (elements) worth a parallel task: ~64 KB of float, a few
// microseconds, well above the cost of handing a task to a thread.
constexpr int64_t kGnMinTaskElems = int64_t{1} << 14;
// Outputs of at least this many bytes are written with streaming (non-temporal) stores: they
// exceed what the per-core caches hold (L2 is 1-2 MB on current x86), so most of y would be
// evicted before the next op reads it anyway, and skipping the read-for-ownership of every
// output line saves a third of the memory traffic (measured: 1.3-1.8x on 8-16 MB tensors).
constexpr int64_t kGnStreamBytes = int64_t{4} << 20;

inline int64_t gn_min(int64_t a, int64_t b) { return a < b ? a : b; }

// sum(x - shift) and sum((x - shift)^2) over p[0..n).
template <class I, class T>
void gn_shifted_sums(const T* p, int64_t n, float shift, double* sum, double* sumsq) {
  using V = typename I::V;
  constexpr int W = I::W;
  const V s = I::set1(shift);
  // Four independent accumulator pairs hide the add latency.
  V a0 = I::zero(), a1 = I::zero(), a2 = I::zero(), a3 = I::zero();
  V q0 = I::zero(), q1 = I::zero(), q2 = I::zero(), q3 = I::zero();
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    const V d0 = I::sub(I::load(p + i), s);
    const V d1 = I::sub(I::load(p + i + W), s);
    const V d2 = I::sub(I::load(p + i + 2 * W), s);
    const V d3 = I::sub(I::load(p + i + 3 * W), s);
    a0 = I::add(a0, d0);
    a1 = I::add(a1, d1);
    a2 = I::add(a2, d2);
    a3 = I::add(a3, d3);
    q0 = I::fmadd(d0, d0, q0);
    q1 = I::fmadd(d1, d1, q1);
    q2 = I::fmadd(d2, d2, q2);
    q3 = I::fmadd(d3, d3, q3);
  }
  for (; i + W <= n; i += W) {
    const V d = I::sub(I::load(p + i), s);
    a0 = I::add(a0, d);
    q0 = I::fmadd(d, d, q0);
  }
  if (i < n) {
    const int r = static_cast<int>(n - i);
    const V d = I::sub_n(I::load_n(p + i, r), s, r);
    a1 = I::add(a1, d);
    q1 = I::fmadd(d, d, q1);
  }
  *sum = I::hsum(a0) + I::hsum(a1) + I::hsum(a2) + I::hsum(a3);
  *sumsq = I::hsum(q0) + I::hsum(q1) + I::hsum(q2) + I::hsum(q3);
}

// Mean and biased variance of g[0..n), n > 0 (see the header comment).
template <class I, class T>
void gn_moments(const T* g, int64_t n, double* mean_out, double* var_out) {
  double count = 0.0, mean = 0.0, m2 = 0.0;
  float shift = I::to_f32(g[0]);
  for (int64_t b0 = 0; b0 < n; b0 += kGnBlock) {
    const int64_t len = gn_min(kGnBlock, n - b0);
    const double nb = static_cast<double>(len);
    double sd = 0.0, sq = 0.0;
    gn_shifted_sums<I>(g + b0, len, shift, &sd, &sq);
    // (block mean - shift)^2 > block variance: re-center on the block's mean.
    if (sd * sd > 0.5 * sq * nb) {
      shift = static_cast<float>(static_cast<double>(shift) + sd / nb);
      gn_shifted_sums<I>(g + b0, len, shift, &sd, &sq);
    }
    const double mb = static_cast<double>(shift) + sd / nb;
    double m2b = sq - sd * sd / nb;
    if (m2b < 0.0) m2b = 0.0;  // rounding; written so that NaN stays NaN
    // Chan et al.: merge (nb, mb, m2b) into (count, mean, m2).
    const double total = count + nb;
    const double delta = mb - mean;
    mean += delta * (nb / total);
    m2 += m2b + delta * delta * (count * nb / total);
    count = total;
    shift = static_cast<float>(mean);
  }
  *mean_out = mean;
  *var_out = m2 / count;
}

// Asks for the cache lines of [p, p + bytes) ahead of use.
inline void gn_prefetch(const void* p, int64_t bytes) {
#if defined(__GNUC__) || defined(__clang__)
  const char* c = static_cast<const char*>(p);
  for (int64_t k = 0; k < bytes; k += 64) __builtin_prefetch(c + k, 0, 2);
#else
  (void)p;
  (void)bytes;
#endif
}

// y[0..n) = (x - m_hi) * a + off. When `next` is not null, the same number of elements from
// `next` are prefetched meanwhile (the next group: its memory reads overlap this pass's work).
// Stream: write y with non-temporal stores (see kGnStreamBytes).
template <class I, bool Stream, class T>
void gn_apply(const T* x, T* y, int64_t n, float m_hi, float a, float off, const T* next) {
  using V = typename I::V;
  constexpr int W = I::W;
  const V vm = I::set1(m_hi), va = I::set1(a), vo = I::set1(off);
  const auto f = [&](V v) { return I::fmadd(I::sub(v, vm), va, vo); };
  int64_t i = 0;
  if (Stream) {
    // Streaming stores need vector-aligned addresses: the elements before the first aligned
    // one (fewer than W) are stored normally.
    constexpr uintptr_t kAlign = W * sizeof(T);
    const int64_t head = static_cast<int64_t>((kAlign - reinterpret_cast<uintptr_t>(y) % kAlign) % kAlign / sizeof(T));
    if (head > 0) {
      i = gn_min(head, n);
      I::store_n(y, f(I::load_n(x, static_cast<int>(i))), static_cast<int>(i));
    }
  }
  for (; i + 4 * W <= n; i += 4 * W) {
    if (next != nullptr) gn_prefetch(next + i, 4 * W * static_cast<int64_t>(sizeof(T)));
    const V y0 = f(I::load(x + i)), y1 = f(I::load(x + i + W));
    const V y2 = f(I::load(x + i + 2 * W)), y3 = f(I::load(x + i + 3 * W));
    if (Stream) {
      I::stream(y + i, y0);
      I::stream(y + i + W, y1);
      I::stream(y + i + 2 * W, y2);
      I::stream(y + i + 3 * W, y3);
    } else {
      I::store(y + i, y0);
      I::store(y + i + W, y1);
      I::store(y + i + 2 * W, y2);
      I::store(y + i + 3 * W, y3);
    }
  }
  if (next != nullptr && i < n) gn_prefetch(next + i, (n - i) * static_cast<int64_t>(sizeof(T)));
  for (; i + W <= n; i += W) {
    if (Stream) {
      I::stream(y + i, f(I::load(x + i)));
    } else {
      I::store(y + i, f(I::load(x + i)));
    }
  }
  if (i < n) {
    const int r = static_cast<int>(n - i);
    I::store_n(y + i, f(I::load_n(x + i, r)), r);
  }
}

template <class I, class T>
void gn_forward(const group_norm_isa::Args<T>& a, const ParallelFor& pf) {
  const int64_t G = a.G, Cg = a.C / a.G, S = a.S;
  const int64_t group_elems = Cg * S;
  if (a.N == 0 || a.C == 0) return;
  if (S == 0) {
    // Empty groups. N * G may be astronomically large here (x = [2^62, 1, 0] is a valid empty
    // tensor), so only touch the statistics when the caller asked for (and so allocated) them.
    if (a.mean != nullptr || a.rstd != nullptr) {
      for (int64_t ng = 0; ng < a.N * G; ++ng) {
        if (a.mean != nullptr) a.mean[ng] = 0.f;
        if (a.rstd != nullptr) a.rstd[ng] = 0.f;
      }
    }
    return;
  }
  const int64_t grain = group_elems >= kGnMinTaskElems ? 1 : kGnMinTaskElems / (group_elems > 0 ? group_elems : 1);
  const bool stream = a.N * a.C * S * static_cast<int64_t>(sizeof(T)) >= kGnStreamBytes;
  pf(a.N * G, grain, [&](int64_t begin, int64_t end) {
    for (int64_t ng = begin; ng < end; ++ng) {
      const int64_t g = ng % G;
      const T* xg = a.x + ng * group_elems;
      T* yg = a.y + ng * group_elems;
      double mean = 0.0, var = 0.0;
      if (group_elems > 0) gn_moments<I>(xg, group_elems, &mean, &var);
      const double rstd = 1.0 / std::sqrt(var + a.eps);
      if (a.mean != nullptr) a.mean[ng] = static_cast<float>(mean);
      if (a.rstd != nullptr) a.rstd[ng] = static_cast<float>(rstd);
      // The next group, also past this task's range: a pool that hands out tasks in order
      // (ORT's does) gives it to this thread or to one that reads it from L3 soon after.
      const T* next = ng + 1 < a.N * G ? xg + group_elems : nullptr;
      const float m_hi = static_cast<float>(mean);
      const double m_lo = mean - static_cast<double>(m_hi);
      for (int64_t ci = 0; ci < Cg; ++ci) {
        const int64_t c = g * Cg + ci;
        const double w = a.weight != nullptr ? static_cast<double>(I::to_f32(a.weight[c])) : 1.0;
        const double b = a.bias != nullptr ? static_cast<double>(I::to_f32(a.bias[c])) : 0.0;
        const double scale = rstd * w;
        const float af = static_cast<float>(scale), off = static_cast<float>(b - m_lo * scale);
        if (!std::isfinite(af) || (!std::isfinite(off) && std::isfinite(b))) {
          // rstd * weight is infinite or NaN (an infinite or NaN weight, eps = 0 on a constant
          // group) or overflows float (var + eps < ~1e-77, e.g. a constant group with eps =
          // 1e-300). Evaluate (x - mean) * rstd * weight + bias as written, in double: a zero
          // deviation then gives bias (or 0 * inf = NaN) and a nonzero one the right infinity,
          // where the folded offset would be inf - inf. Rare and per channel: no cost otherwise.
          const T* xc = xg + ci * S;
          T* yc = yg + ci * S;
          for (int64_t i = 0; i < S; ++i) {
            const double d = static_cast<double>(I::to_f32(xc[i]) - m_hi) - m_lo;
            yc[i] = from_acc<T>(static_cast<float>(d * scale + b));
          }
          continue;
        }
        const T* pnext = next == nullptr ? nullptr : next + ci * S;
        if (stream) {
          gn_apply<I, true>(xg + ci * S, yg + ci * S, S, m_hi, af, off, pnext);
        } else {
          gn_apply<I, false>(xg + ci * S, yg + ci * S, S, m_hi, af, off, pnext);
        }
      }
    }
    // Streamed stores must be globally visible before the caller learns this task is done.
    if (stream) I::fence();
  });
}

}  // namespace
}  // namespace opbridge
