// GroupNorm forward written once over a SIMD wrapper (cpp/common/simd_*.h) and compiled once per
// instruction set (internal header; linkage as explained in simd_avx512.h).
//
// Memory traffic is the cost. The floor is a copy: read x once, write y once. Where the data of
// one statistics unit (a group in [N, C, S], a sample in [N, S, C]) fits in the per-core cache
// budget, it is read from memory once, for the statistics, and normalized while it is still in
// L2; otherwise it is read twice (the statistics must be complete before any output).
//
// [N, C, S]: one task per (n, g) group: the group's moments in blocks small enough for L1, then
// the normalization from L2 (the next group is prefetched meanwhile).
// [N, S, C]: the groups interleave within each row of C channels, so statistics accumulate per
// channel over rows (vectorized across channels) and fold into per-group moments per block of
// rows. Samples that fit the cache budget are one task each (statistics, then normalization
// from L2) when there are enough of them to keep every thread busy; otherwise the samples are
// cut into tiles of rows, processed in waves of a few samples: statistics of every tile of the
// wave (one parallel pass), then normalization of the same tiles, each range of tiles merging
// the moments of its samples first (a second pass, whose tiles the same thread read just before
// when the pool partitions ranges statically, as torch's OpenMP pool does; walked backwards, so
// that the part still in L2 is read before the rest evicts it).
//
// Statistics: each block is summed as deviations d = x - shift in float lanes (sum d and
// sum d^2 in one pass), folded into double, and merged into the group's running (count, mean,
// M2) with Chan's parallel formula in double. The shift is the group's running mean (for the
// first block: the mean of its first 16 elements, or in [N, S, C] of the group's channels in the
// first rows), so a large common offset (mean 1e6, unit variance) never enters the float sums; a block
// whose own mean lies further from the shift than its spread is summed once more around its mean
// while it is still in cache (in [N, S, C] only that group's channels), so
// sum d^2 - (sum d)^2 / n never cancels more than half its digits. A constant group gives d = 0
// exactly: mean exact, variance 0.
//
// Normalization: y = act((x - m_hi) * a_c + (b_c - m_lo * a_c)), with the mean split into float
// m_hi + m_lo: x - m_hi is exact near a large mean, where the usual x * a + (b - mean * a) would
// round the offset to float and lose the output's digits.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "group_norm_isa.h"
#include "opbridge/parallel.h"

namespace opbridge {
namespace {

// Elements per statistics block of a [N, C, S] group: 16 KB of float (8 KB of 16-bit) sits in
// any L1 for the occasional second pass, and each float lane sums at most kGnBlock / (4 * W)
// <= 128 terms, so its rounding error stays far below float epsilon * |sum|.
constexpr int64_t kGnBlock = 4096;
// Elements per statistics block of [N, S, C] rows (64 KB of float, in L2 for a second pass),
// and at most 128 rows where each row is one addition into the per-channel float sums, so that
// each of them takes at most 128 additions (as above); a sums policy that adds several rows at a
// time takes proportionally more rows (its max_block_rows()). Fewer, larger blocks matter where C
// is small: each block costs per-group work (fold, merge, new shifts).
constexpr int64_t kGnRowBlockElems = 65536;
constexpr int64_t kGnMaxBlockRows = 128;
// Smallest amount of work (elements) worth a parallel task: ~64 KB of float, a few
// microseconds, well above the cost of handing a task to a thread.
constexpr int64_t kGnMinTaskElems = int64_t{1} << 14;
// Rows of a [N, S, C] tile: at most this many bytes (a sample's rows shared evenly between its
// tiles), so that a sample splits into enough tiles to balance the threads and the per-tile work
// (merging G moments) stays negligible.
constexpr int64_t kGnTileBytes = int64_t{256} << 10;
// [N, S, C] samples that fit the cache budget are one task each from this many samples on: with
// fewer, whole-sample tasks would leave threads idle (or unevenly loaded) on common pools.
constexpr int64_t kGnMinSampleTasks = 8;

inline int64_t gn_min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t gn_max(int64_t a, int64_t b) { return a > b ? a : b; }

// Calls f(act, nhwc) with the activation as a compile-time constant (an std::integral_constant),
// so that the kernels' inner loops are compiled once per activation; nhwc: whether d takes the
// [N, S, C] kernels. One channel per row: [N, S, 1] is [N, 1, S] in memory.
template <class F>
void gn_layout_and_act(const GroupNormDims& d, Activation act, const F& f) {
  const bool nhwc = d.channels_last && d.C > 1 && d.S > 1;
  if (act == Activation::kSilu) {
    f(std::integral_constant<Activation, Activation::kSilu>{}, nhwc);
  } else {
    f(std::integral_constant<Activation, Activation::kNone>{}, nhwc);
  }
}

// Elements of T before the first address at or after p that is aligned to a vector of I
// (0 <= result < I::W): where aligned loads and streaming stores can start.
template <class I, class T>
int64_t gn_unaligned_head(const T* p) {
  constexpr uintptr_t kAlign = I::W * sizeof(T);
  return static_cast<int64_t>((kAlign - reinterpret_cast<uintptr_t>(p) % kAlign) % kAlign / sizeof(T));
}

// Rows per tile of a [N, S, C] sample whose rows take row_bytes each, and the tiles per sample
// (*tiles): the fewest tiles of at most kGnTileBytes, the rows shared evenly between them (not
// full tiles and a short last one, which left the threads' shares of a sample or two uneven:
// forward (1, 1280, 16, 16) 3.1-3.2x -> 2.4-2.9x a copy, (2, 320, 64, 64) 1.40x -> 1.34-1.35x;
// backward (1, 320, 32, 32), 5 tiles of 204 rows and one of 4, 4.9-5.0x -> 3.9-4.0x with 171 rows
// each). The last tile keeps at least one row: (tiles - 1) * rows <= (tiles - 1) * max < S.
inline int64_t gn_tile_rows(int64_t S, int64_t row_bytes, int64_t* tiles) {
  const int64_t max_rows = gn_max(1, kGnTileBytes / row_bytes);
  *tiles = (S + max_rows - 1) / max_rows;
  return (S + *tiles - 1) / *tiles;
}

// exp(-z) for silu(z) = z / (1 + exp(-z)) and its derivative (backward pass): 2^t, with
// t = -z * log2(e) = n + f, n an integer and |f| <= 1/2: 2^f from a degree-5 near-minimax
// polynomial (relative error 7.5e-8, ~2.4e-7 as evaluated in float: below what the
// normalization before it rounds away), times 2^n. t is clamped to [-126, 128]: below, 2^t
// vanishes next to 1 anyway (silu(z) = z for z > 87.3); at the top, n = 128 gives 2^n = inf, so
// that silu(z) = -0 for z < -88.4 and silu(-inf) = NaN as torch gives them (z / inf; torch gives
// about -3e-37 for z in (-88.7, -88.4), where exp(-z) is still a float). Every 2^n is then
// one exponent field (scalef needs no two-step scaling on AVX2: the SiLU normalization took
// 3.3-4.9 ns a vector instead of 5.8-7.3, one thread on an AMD EPYC Zen 3). NaN z gives NaN
// through the numerator. Written for few instructions per vector: the fused activation runs
// inside GroupNorm's normalization pass, whose budget is a copy's.
template <class I>
typename I::V gn_exp_neg(typename I::V z) {
  using V = typename I::V;
  const V t = I::max(I::min(I::mul(z, I::set1(-1.44269504088896341f)), I::set1(128.0f)), I::set1(-126.0f));
  const V n = I::round(t);
  const V f = I::sub(t, n);
  V p = I::set1(1.327647129073739e-3f);
  p = I::fmadd(p, f, I::set1(9.675540961325169e-3f));
  p = I::fmadd(p, f, I::set1(5.550713092088699e-2f));
  p = I::fmadd(p, f, I::set1(2.4022120237350464e-1f));
  p = I::fmadd(p, f, I::set1(6.931469440460205e-1f));
  p = I::fmadd(p, f, I::set1(1.0000001192092896f));
  return I::scalef(p, n);
}

template <class I>
typename I::V gn_silu(typename I::V z) {
  return I::div(z, I::add(I::set1(1.0f), gn_exp_neg<I>(z)));
}

template <class I, Activation A>
typename I::V gn_act(typename I::V z) {
  if constexpr (A == Activation::kSilu) {
    return gn_silu<I>(z);
  } else {
    return z;
  }
}

// The activation in double, for the rare channels normalized in double (see gn_apply callers).
inline double gn_act_double(Activation act, double z) { return act == Activation::kSilu ? z / (1.0 + std::exp(-z)) : z; }

// One step of gn_shifted_sums over 4 vectors at p: d = x - s, a_k += d_k, q_k += d_k^2. The
// fused normalization (gn_apply_and_sum) takes the same steps, so both sum alike.
template <class I, class T>
void gn_sums_step4(const T* p, typename I::V s, typename I::V* a0, typename I::V* a1, typename I::V* a2,
                   typename I::V* a3, typename I::V* q0, typename I::V* q1, typename I::V* q2, typename I::V* q3) {
  using V = typename I::V;
  constexpr int W = I::W;
  const V d0 = I::sub(I::load(p), s);
  const V d1 = I::sub(I::load(p + W), s);
  const V d2 = I::sub(I::load(p + 2 * W), s);
  const V d3 = I::sub(I::load(p + 3 * W), s);
  *a0 = I::add(*a0, d0);
  *a1 = I::add(*a1, d1);
  *a2 = I::add(*a2, d2);
  *a3 = I::add(*a3, d3);
  *q0 = I::fmadd(d0, d0, *q0);
  *q1 = I::fmadd(d1, d1, *q1);
  *q2 = I::fmadd(d2, d2, *q2);
  *q3 = I::fmadd(d3, d3, *q3);
}

// The lanes of gn_shifted_sums's accumulators folded into its two sums.
template <class I>
void gn_sums_fold(typename I::V a0, typename I::V a1, typename I::V a2, typename I::V a3, typename I::V q0,
                  typename I::V q1, typename I::V q2, typename I::V q3, double* sum, double* sumsq) {
  *sum = I::hsum(a0) + I::hsum(a1) + I::hsum(a2) + I::hsum(a3);
  *sumsq = I::hsum(q0) + I::hsum(q1) + I::hsum(q2) + I::hsum(q3);
}

// sum(x - shift) and sum((x - shift)^2) over p[0..n).
template <class I, class T>
void gn_shifted_sums(const T* p, int64_t n, float shift, double* sum, double* sumsq) {
  using V = typename I::V;
  constexpr int W = I::W;
  const V s = I::set1(shift);
  // Four independent accumulator pairs hide the add latency.
  V a0 = I::zero(), a1 = I::zero(), a2 = I::zero(), a3 = I::zero();
  V q0 = I::zero(), q1 = I::zero(), q2 = I::zero(), q3 = I::zero();
  // The elements before the first vector-aligned one (fewer than W) are summed on their own, so
  // that the loop's loads never straddle two cache lines where a group starts inside a vector:
  // (1, 512, 3199) [wav2vec2's GroupNorm(512, 512)], forward 1.12-1.13x -> 1.05-1.08x a copy.
  int64_t i = gn_min(n, gn_unaligned_head<I>(p));
  if (i > 0) {
    a2 = I::sub_n(I::load_n(p, static_cast<int>(i)), s, static_cast<int>(i));
    q2 = I::mul(a2, a2);
  }
  for (; i + 4 * W <= n; i += 4 * W) gn_sums_step4<I>(p + i, s, &a0, &a1, &a2, &a3, &q0, &q1, &q2, &q3);
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
  gn_sums_fold<I>(a0, a1, a2, a3, q0, q1, q2, q3, sum, sumsq);
}

// Chan et al.: updates a group's running (mean, m2) with a block of mean mb and M2 m2b, given the
// weights nb / total and count * nb / total (count: the elements so far, nb: the block's).
inline void gn_chan_update(double* mean, double* m2, double mb, double m2b, double w_new, double w_cross) {
  const double delta = mb - *mean;
  *mean += delta * w_new;
  *m2 += m2b + delta * delta * w_cross;
}

// Running moments of one group: element count, mean, and sum of squared deviations M2.
struct GnMoments {
  double count = 0.0, mean = 0.0, m2 = 0.0;

  // Merges a block of nb elements with mean mb and M2 m2b.
  void merge(double nb, double mb, double m2b) {
    const double total = count + nb;
    gn_chan_update(&mean, &m2, mb, m2b, nb / total, count * nb / total);
    count = total;
  }
  void merge(const GnMoments& o) {
    if (o.count > 0.0) merge(o.count, o.mean, o.m2);
  }
};

// The moments of every group of one sample (out[0..G)) from those of its `tiles` tiles
// (partial[t * G + g]), merged tile by tile in order: the same operations as GnMoments::merge
// group by group, so the same bits, with Chan's weights computed once per tile (a tile's groups
// share its element count) instead of two divisions per group and tile. What the channels-last
// forward spends outside its two passes (the parallel regions, these merges, the coefficients;
// the passes' loops taken out) at 2,128,64,64, G = 32, eight tiles a sample: 0.85, 0.87 and 1.02
// of its time before, about 1 us of 7 (AVX2, AMD EPYC Zen 3, 2 threads, side by side in one
// process).
inline void gn_merge_tiles(const GnMoments* partial, int64_t tiles, int64_t G, GnMoments* out) {
  double count = 0.0;
  for (int64_t g = 0; g < G; ++g) out[g] = GnMoments();
  for (int64_t t = 0; t < tiles; ++t) {
    const GnMoments* p = partial + t * G;
    const double nb = p[0].count;
    if (!(nb > 0.0)) continue;
    const double total = count + nb, w_new = nb / total, w_cross = count * nb / total;
    for (int64_t g = 0; g < G; ++g) gn_chan_update(&out[g].mean, &out[g].m2, p[g].mean, p[g].m2, w_new, w_cross);
    count = total;
  }
  for (int64_t g = 0; g < G; ++g) out[g].count = count;
}

// The mean and M2 of a block of nb elements (inv_nb = 1 / nb) summed around `shift`:
// sd = sum(x - shift), sq = sum((x - shift)^2).
inline void gn_block_moments(float shift, double sd, double sq, double inv_nb, double* mb, double* m2b) {
  *mb = static_cast<double>(shift) + sd * inv_nb;
  *m2b = sq - sd * sd * inv_nb;
  if (*m2b < 0.0) *m2b = 0.0;  // rounding; written so that NaN stays NaN
}

inline void gn_merge_block(GnMoments* m, double nb, float shift, double sd, double sq) {
  double mb = 0.0, m2b = 0.0;
  gn_block_moments(shift, sd, sq, 1.0 / nb, &mb, &m2b);
  m->merge(nb, mb, m2b);
}

// Whether a block summed around `shift` must be summed again around its own mean: its mean lies
// further from the shift than its spread, so sq - sd^2 / nb would cancel most digits.
inline bool gn_needs_recentering(double nb, double sd, double sq) { return sd * sd > 0.5 * sq * nb; }

// The first shift of a group or of a [N, S, C] sample's groups: the mean of at least this many
// elements, an estimate of the group's mean close enough that the first block rarely needs
// summing again around its own mean. (A single element of a unit-variance group lies further
// from the mean than the group's spread in a third of the groups, each of which then summed its
// first block twice: [N, C, S] (8, 512, 799) 1.11-1.12x -> 1.03-1.05x a copy, (8, 256, 32, 32)
// 0.99x -> 0.96-0.97x; [N, S, C] (64, 32, 32, 32), where the second sum re-reads the block's
// rows for one channel each, took longer than the block's sums.)
constexpr int64_t kGnFirstShiftElems = 16;

// Mean and biased variance of the contiguous g[0..n), n > 0 (see the header comment).
// The first shift of the contiguous group g[0..n): the mean of its first elements.
template <class I, class T>
float gn_first_shift(const T* g, int64_t n) {
  const int64_t k = gn_min(n, kGnFirstShiftElems);
  double first = 0.0;
  for (int64_t i = 0; i < k; ++i) first += static_cast<double>(I::to_f32(g[i]));
  return static_cast<float>(first / static_cast<double>(k));
}

// Merges the block blk[0..len) of a group, summed around *shift into sd, sq, into the group's
// moments m (summing it again around its own mean first where needed), and moves *shift to the
// running mean.
template <class I, class T>
void gn_moments_block(GnMoments* m, float* shift, const T* blk, int64_t len, double sd, double sq) {
  const double nb = static_cast<double>(len);
  if (gn_needs_recentering(nb, sd, sq)) {
    *shift = static_cast<float>(static_cast<double>(*shift) + sd / nb);
    gn_shifted_sums<I>(blk, len, *shift, &sd, &sq);
  }
  gn_merge_block(m, nb, *shift, sd, sq);
  *shift = static_cast<float>(m->mean);
}

template <class I, class T>
void gn_moments(const T* g, int64_t n, double* mean_out, double* var_out) {
  GnMoments m;
  float shift = gn_first_shift<I>(g, n);
  for (int64_t b0 = 0; b0 < n; b0 += kGnBlock) {
    const int64_t len = gn_min(kGnBlock, n - b0);
    double sd = 0.0, sq = 0.0;
    gn_shifted_sums<I>(g + b0, len, shift, &sd, &sq);
    gn_moments_block<I>(&m, &shift, g + b0, len, sd, sq);
  }
  *mean_out = m.mean;
  *var_out = m.m2 / m.count;
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

// *y = v (Stream: a non-temporal store).
template <class I, bool Stream, class T>
void gn_store(T* y, typename I::V v) {
  if constexpr (Stream) {
    I::stream(y, v);
  } else {
    I::store(y, v);
  }
}

// y[i..i + 4 W) = y0..y3 (Stream: non-temporal stores).
template <class I, bool Stream, class T>
void gn_store4(T* y, int64_t i, typename I::V y0, typename I::V y1, typename I::V y2, typename I::V y3) {
  constexpr int W = I::W;
  gn_store<I, Stream>(y + i, y0);
  gn_store<I, Stream>(y + i + W, y1);
  gn_store<I, Stream>(y + i + 2 * W, y2);
  gn_store<I, Stream>(y + i + 3 * W, y3);
}

// y[i..i + 4 W) = act((x - vm) * va + vo) for four vectors at i (Stream: non-temporal stores).
template <class I, Activation A, bool Stream, class T>
void gn_apply4(const T* x, T* y, int64_t i, typename I::V vm, typename I::V va, typename I::V vo) {
  using V = typename I::V;
  constexpr int W = I::W;
  const auto f = [&](V v) { return gn_act<I, A>(I::fmadd(I::sub(v, vm), va, vo)); };
  const V y0 = f(I::load(x + i)), y1 = f(I::load(x + i + W));
  const V y2 = f(I::load(x + i + 2 * W)), y3 = f(I::load(x + i + 3 * W));
  gn_store4<I, Stream>(y, i, y0, y1, y2, y3);
}

// y[0..n) = act((x - m_hi) * a + off). When `next` is not null, the same number of elements
// from `next` are prefetched meanwhile (the next group: its memory reads overlap this pass's
// work). Stream: write y with non-temporal stores (see Args::stream_bytes).
template <class I, Activation A, bool Stream, class T>
void gn_apply(const T* x, T* y, int64_t n, float m_hi, float a, float off, const T* next) {
  using V = typename I::V;
  constexpr int W = I::W;
  const V vm = I::set1(m_hi), va = I::set1(a), vo = I::set1(off);
  const auto f = [&](V v) { return gn_act<I, A>(I::fmadd(I::sub(v, vm), va, vo)); };
  int64_t i = 0;
  if (Stream) {
    // Streaming stores need vector-aligned addresses: the elements before the first aligned
    // one (fewer than W) are stored normally.
    const int64_t head = gn_unaligned_head<I>(y);
    if (head > 0) {
      i = gn_min(head, n);
      I::store_n(y, f(I::load_n(x, static_cast<int>(i))), static_cast<int>(i));
    }
  }
  for (; i + 4 * W <= n; i += 4 * W) {
    if (next != nullptr) gn_prefetch(next + i, 4 * W * static_cast<int64_t>(sizeof(T)));
    gn_apply4<I, A, Stream>(x, y, i, vm, va, vo);
  }
  if (next != nullptr && i < n) gn_prefetch(next + i, (n - i) * static_cast<int64_t>(sizeof(T)));
  for (; i + W <= n; i += W) gn_store<I, Stream>(y + i, f(I::load(x + i)));
  if (i < n) {
    const int r = static_cast<int>(n - i);
    I::store_n(y + i, f(I::load_n(x + i, r)), r);
  }
}

// Per-channel normalization coefficients of one sample: y = act((x - mh[c]) * a[c] + off[c]);
// `exact` lists the channels whose coefficients are not finite floats (see gn_coefficients).
struct GnCoefficients {
  std::vector<float> mh, a, off;
  // Channels-last rows whose channels are no whole number of vectors: mh, a and off repeated
  // over a period, the fewest whole rows that are whole vectors (gn_nhwc_period); empty where
  // not used.
  std::vector<float> pmh, pa, poff;
  std::vector<int64_t> exact;
  std::vector<double> exact_mean, exact_scale, exact_bias;
};

// The coefficients of channel c, given its group's mean and rstd. Returns false where
// rstd * weight is infinite or NaN (an infinite or NaN weight, eps = 0 on a constant group) or
// overflows float (var + eps < ~1e-77, e.g. a constant group with eps = 1e-300): the channel
// must then be evaluated as (x - mean) * rstd * weight + bias, in double, so that a zero
// deviation gives bias (or 0 * inf = NaN) and a nonzero one the right infinity, where the
// folded offset would be inf - inf. Rare and per channel: no cost otherwise.
template <class I, class T>
bool gn_channel_coefficients(const T* weight, const T* bias, int64_t c, double mean, double rstd, float* mh,
                             float* a, float* off, double* scale_out, double* bias_out) {
  const float m_hi = static_cast<float>(mean);
  const double m_lo = mean - static_cast<double>(m_hi);
  const double w = weight != nullptr ? static_cast<double>(I::to_f32(weight[c])) : 1.0;
  const double b = bias != nullptr ? static_cast<double>(I::to_f32(bias[c])) : 0.0;
  const double scale = rstd * w;
  *mh = m_hi;
  *a = static_cast<float>(scale);
  *off = static_cast<float>(b - m_lo * scale);
  *scale_out = scale;
  *bias_out = b;
  return std::isfinite(*a) && (std::isfinite(*off) || !std::isfinite(b));
}

// One channel of one group in double (the rare case above): y[i * stride] for i < n.
template <class I, class T>
void gn_apply_exact(const T* x, T* y, int64_t n, int64_t stride, double mean, double scale, double b, Activation act) {
  const float m_hi = static_cast<float>(mean);
  const double m_lo = mean - static_cast<double>(m_hi);
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(I::to_f32(x[i * stride]) - m_hi) - m_lo;
    y[i * stride] = from_acc<T>(static_cast<float>(gn_act_double(act, d * scale + b)));
  }
}

// ---- [N, C, S] ---------------------------------------------------------------------------------

// Normalizes group x[0..n) into y with per-channel coefficients (channel ci: y = act((x - mh[ci])
// * ka[ci] + ko[ci]), S elements each, channels with skip[ci] left alone) while summing the next
// group nx[0..n) into *m (its moments so far, around *shift): one pass, in which the next
// group's reads from the L3 or memory overlap this group's writes, where the statistics pass on
// its own and the normalization after it took turns. Needs S % (4 W) == 0 and nx aligned to a
// vector, and then sums exactly as gn_moments does (the same steps gn_sums_step4 in the same
// order, block by block), so the result is the same whichever way the groups are split between
// tasks. With nx = nullptr, only normalizes; with y = nullptr, only sums.
// Elements per chunk of gn_apply_and_sum (a multiple of 4 vectors of 16).
constexpr int64_t kGnFusedChunk = 256;

template <class I, Activation A, bool Stream, class T>
void gn_apply_and_sum(const T* x, T* y, int64_t n, int64_t S, const float* mh, const float* ka, const float* ko,
                      const unsigned char* skip, const T* nx, GnMoments* m, float* shift) {
  using V = typename I::V;
  constexpr int W = I::W;
  for (int64_t b0 = 0; b0 < n; b0 += kGnBlock) {
    const int64_t b1 = gn_min(n, b0 + kGnBlock);
    const V s = I::set1(*shift);
    V a0 = I::zero(), a1 = I::zero(), a2 = I::zero(), a3 = I::zero();
    V q0 = I::zero(), q1 = I::zero(), q2 = I::zero(), q3 = I::zero();
    for (int64_t c0 = b0; c0 < b1;) {
      const int64_t ci = c0 / S, c1 = gn_min(b1, (ci + 1) * S);
      const bool on = y != nullptr && skip[ci] == 0;
      const V vm = I::set1(mh[ci]), va = I::set1(ka[ci]), vo = I::set1(ko[ci]);
      // Chunk by chunk (a few cache lines of each): summing and normalizing in one loop kept the
      // eight sums and the normalization's operands in registers at once, more than AVX2 has
      // (measured with the fused SiLU, which this pass no longer takes: gn_forward_nchw).
      for (int64_t i0 = c0; i0 < c1; i0 += kGnFusedChunk) {
        const int64_t i1 = gn_min(c1, i0 + kGnFusedChunk);
        if (nx != nullptr) {
          for (int64_t i = i0; i < i1; i += 4 * W) gn_sums_step4<I>(nx + i, s, &a0, &a1, &a2, &a3, &q0, &q1, &q2, &q3);
        }
        if (on) {
          for (int64_t i = i0; i < i1; i += 4 * W) gn_apply4<I, A, Stream>(x, y, i, vm, va, vo);
        }
      }
      c0 = c1;
    }
    if (nx != nullptr) {
      double sd = 0.0, sq = 0.0;
      gn_sums_fold<I>(a0, a1, a2, a3, q0, q1, q2, q3, &sd, &sq);
      gn_moments_block<I>(m, shift, nx + b0, b1 - b0, sd, sq);
    }
  }
}

// [N, C, S] with the statistics of each group summed during the normalization of the one before
// it in the same task (gn_apply_and_sum): on an AMD EPYC Zen 3, x and y in the L3, one thread,
// 64 KB groups, a microbenchmark of the two schedules: statistics then normalization per group
// 1.5-1.9x the time of a copy loop, fused 1.25-1.3x. For groups that fit the cache budget, with
// channels of whole steps of 4 vectors (S % (4 W) == 0) and x aligned to a vector; else
// gn_forward_nchw_split.
template <class I, Activation A, class T>
void gn_forward_nchw_fused(const group_norm_isa::Args<T>& a, const ParallelFor& pf, bool stream) {
  const int64_t G = a.d.G, Cg = a.d.C / a.d.G, S = a.d.S;
  const int64_t group_elems = Cg * S;
  const int64_t grain = group_elems >= kGnMinTaskElems ? 1 : kGnMinTaskElems / group_elems;
  // Streaming stores need aligned vectors: every group starts at one where y does.
  const bool nt = stream && gn_unaligned_head<I>(a.y) == 0;
  pf(a.d.N * G, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> mh(static_cast<size_t>(Cg)), ka(static_cast<size_t>(Cg)), ko(static_cast<size_t>(Cg));
    std::vector<unsigned char> skip(static_cast<size_t>(Cg));
    std::vector<double> ex_scale(static_cast<size_t>(Cg)), ex_bias(static_cast<size_t>(Cg));
    // The moments of the group about to be normalized: the first one's on its own.
    GnMoments m;
    {
      const T* x0 = a.x + begin * group_elems;
      float shift = gn_first_shift<I>(x0, group_elems);
      gn_apply_and_sum<I, A, false>(x0, static_cast<T*>(nullptr), group_elems, S, mh.data(), ka.data(), ko.data(),
                                    skip.data(), x0, &m, &shift);
    }
    for (int64_t ng = begin; ng < end; ++ng) {
      const int64_t g = ng % G;
      const T* xg = a.x + ng * group_elems;
      T* yg = a.y + ng * group_elems;
      const double mean = m.mean;
      const double rstd = 1.0 / std::sqrt(m.m2 / m.count + a.eps);
      if (a.mean != nullptr) a.mean[ng] = static_cast<float>(mean);
      if (a.rstd != nullptr) a.rstd[ng] = static_cast<float>(rstd);
      bool any_exact = false;
      for (int64_t ci = 0; ci < Cg; ++ci) {
        skip[ci] = !gn_channel_coefficients<I>(a.weight, a.bias, g * Cg + ci, mean, rstd, &mh[ci], &ka[ci], &ko[ci],
                                               &ex_scale[ci], &ex_bias[ci]);
        any_exact = any_exact || skip[ci] != 0;
      }
      const T* nx = ng + 1 < end ? xg + group_elems : nullptr;
      m = GnMoments();
      float shift = nx != nullptr ? gn_first_shift<I>(nx, group_elems) : 0.f;
      if (nt) {
        gn_apply_and_sum<I, A, true>(xg, yg, group_elems, S, mh.data(), ka.data(), ko.data(), skip.data(), nx, &m,
                                     &shift);
      } else {
        gn_apply_and_sum<I, A, false>(xg, yg, group_elems, S, mh.data(), ka.data(), ko.data(), skip.data(), nx, &m,
                                      &shift);
      }
      for (int64_t ci = 0; any_exact && ci < Cg; ++ci) {
        if (skip[ci] != 0) gn_apply_exact<I>(xg + ci * S, yg + ci * S, S, 1, mean, ex_scale[ci], ex_bias[ci], a.act);
      }
    }
    if (nt) I::fence();
  });
}

// [N, C, S], one group at a time: its moments, then its normalization from cache (the next
// group prefetched meanwhile where groups fit the cache budget: `fits`).
template <class I, Activation A, class T>
void gn_forward_nchw_split(const group_norm_isa::Args<T>& a, const ParallelFor& pf, bool stream, bool fits) {
  const int64_t G = a.d.G, Cg = a.d.C / a.d.G, S = a.d.S;
  const int64_t group_elems = Cg * S;
  const int64_t grain = group_elems >= kGnMinTaskElems ? 1 : kGnMinTaskElems / group_elems;
  pf(a.d.N * G, grain, [&](int64_t begin, int64_t end) {
    for (int64_t ng = begin; ng < end; ++ng) {
      const int64_t g = ng % G;
      const T* xg = a.x + ng * group_elems;
      T* yg = a.y + ng * group_elems;
      double mean = 0.0, var = 0.0;
      gn_moments<I>(xg, group_elems, &mean, &var);
      const double rstd = 1.0 / std::sqrt(var + a.eps);
      if (a.mean != nullptr) a.mean[ng] = static_cast<float>(mean);
      if (a.rstd != nullptr) a.rstd[ng] = static_cast<float>(rstd);
      // The next group, also past this task's range: a pool that hands out tasks in order
      // (ORT's does) gives it to this thread or to one that reads it from L3 soon after. A
      // group larger than the cache budget is read from memory twice anyway: no prefetch.
      const bool prefetch = fits && ng + 1 < a.d.N * G;
      const T* next = prefetch ? xg + group_elems : nullptr;
      for (int64_t ci = 0; ci < Cg; ++ci) {
        const int64_t c = g * Cg + ci;
        float mh = 0.f, af = 0.f, off = 0.f;
        double scale = 0.0, b = 0.0;
        if (!gn_channel_coefficients<I>(a.weight, a.bias, c, mean, rstd, &mh, &af, &off, &scale, &b)) {
          gn_apply_exact<I>(xg + ci * S, yg + ci * S, S, 1, mean, scale, b, a.act);
          continue;
        }
        const T* pnext = next == nullptr ? nullptr : next + ci * S;
        if (stream) {
          gn_apply<I, A, true>(xg + ci * S, yg + ci * S, S, mh, af, off, pnext);
        } else {
          gn_apply<I, A, false>(xg + ci * S, yg + ci * S, S, mh, af, off, pnext);
        }
      }
    }
    // Streamed stores must be globally visible before the caller learns this task is done.
    if (stream) I::fence();
  });
}

template <class I, Activation A, class T>
void gn_forward_nchw(const group_norm_isa::Args<T>& a, const ParallelFor& pf) {
  const int64_t S = a.d.S, group_elems = a.d.C / a.d.G * S;
  const bool stream = a.d.N * a.d.C * S * static_cast<int64_t>(sizeof(T)) >= a.stream_bytes;
  const int64_t budget = stream ? a.cache_budget_streamed : a.cache_budget;
  const bool fits = group_elems * static_cast<int64_t>(sizeof(T)) <= budget;
  // Not with SiLU: its normalization is bound by arithmetic, not by memory, so there are no
  // reads to overlap, and the sums then only add work to it. On an AMD EPYC Zen 3 (AVX2) the fused
  // pass with SiLU took 0.97-1.03 of the split one's time; on an Intel Xeon (AVX-512, 2 MB L2,
  // 2 threads, group_norm_ab.sh with GN_AB_B_FUSE=0) the split one took 0.68-0.90 of the fused
  // one's at 2,128,64,64, 32,64,32,32, 1,512,64,64, 2,320,64,64, 2,512,64,64 and 8,256,32,32
  // (64,32,32,32: 0.93-0.99).
  if constexpr (A == Activation::kNone) {
    if (a.fuse_groups && fits && S % (4 * I::W) == 0 && gn_unaligned_head<I>(a.x) == 0) {
      gn_forward_nchw_fused<I, A>(a, pf, stream);
      return;
    }
  }
  gn_forward_nchw_split<I, A>(a, pf, stream, fits);
}

// ---- [N, S, C] ---------------------------------------------------------------------------------

// Elements per period of channels-last rows of C channels, the fewest whole rows that are whole
// vectors of W (lcm(C, W)), or 0 where C is a whole number of vectors or the period is longer than
// kGnMaxPeriod (its three coefficient arrays then no longer fit the L1 comfortably).
constexpr int64_t kGnMaxPeriod = 1024;
inline int64_t gn_nhwc_period(int64_t C, int W) {
  if (C % W == 0) return 0;
  const int64_t period = std::lcm(C, int64_t{W});
  return period <= kGnMaxPeriod ? period : 0;
}

// One step of gn_rows_sums for one vector of channels: with d = x - s in each of four rows
// (ld elements apart), a += (d0 + d1) + (d2 + d3) and q += d0^2 + d1^2 + d2^2 + d3^2 (one
// addition into each per-channel sum per four rows). Both variants below take this step, so
// they add the same terms in the same order.
template <class I, class T>
void gn_four_rows_sums(const T* x0, int64_t ld, typename I::V s, typename I::V* a, typename I::V* q) {
  using V = typename I::V;
  const V d0 = I::sub(I::load(x0), s), d1 = I::sub(I::load(x0 + ld), s);
  const V d2 = I::sub(I::load(x0 + 2 * ld), s), d3 = I::sub(I::load(x0 + 3 * ld), s);
  *a = I::add(*a, I::add(I::add(d0, d1), I::add(d2, d3)));
  *q = I::add(*q, I::fmadd(d0, d0, I::fmadd(d1, d1, I::fmadd(d2, d2, I::mul(d3, d3)))));
}

// The same for one row (the rows left over after the steps of four): a += d, q += d^2.
template <class I, class T>
void gn_one_row_sums(const T* xr, typename I::V s, typename I::V* a, typename I::V* q) {
  const typename I::V d = I::sub(I::load(xr), s);
  *a = I::add(*a, d);
  *q = I::fmadd(d, d, *q);
}

// gn_rows_sums for rows of exactly NV vectors, with the shifts and both sums of every channel
// held in registers over all the rows (the same additions in the same order, so the same
// result). In memory, each sum's load-add-store through L1 chained one step of four rows to the
// next, and the statistics took 1.13-1.17x the time of a plain read of x at C = 32 to 64.
// Channels-last forward, C++ harness, Xeon, 2 threads, in units of a copy, before -> after:
// 64,32,32,32 1.13-1.15x -> 1.08x; 32,64,32,32 1.16-1.18x -> 1.09-1.10x; 32,96,32,32
// 1.15-1.19x -> 1.09-1.11x; 16,128,32,32 1.16-1.18x -> 1.12-1.13x; 2,128,64,64 (tiles)
// 1.02-1.04x -> 0.98-0.99x; 32,64,32,32 + SiLU 1.49x -> 1.41x.
template <class I, int NV, class T>
void gn_rows_sums_in_registers(const T* x, int64_t rows, int64_t ld, const float* sh, float* s1, float* s2) {
  using V = typename I::V;
  constexpr int W = I::W;
  V s[NV], a[NV], q[NV];
  for (int k = 0; k < NV; ++k) {
    s[k] = I::load(sh + k * W);
    a[k] = I::load(s1 + k * W);
    q[k] = I::load(s2 + k * W);
  }
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    for (int k = 0; k < NV; ++k) gn_four_rows_sums<I>(x + r * ld + k * W, ld, s[k], &a[k], &q[k]);
  }
  for (; r < rows; ++r) {
    for (int k = 0; k < NV; ++k) gn_one_row_sums<I>(x + r * ld + k * W, s[k], &a[k], &q[k]);
  }
  for (int k = 0; k < NV; ++k) {
    I::store(s1 + k * W, a[k]);
    I::store(s2 + k * W, q[k]);
  }
}

// gn_rows_sums_in_registers<I, nv> for a run-time nv in [1, NV]; false where nv is outside.
template <class I, int NV, class T>
bool gn_rows_sums_in_registers_upto(int64_t nv, const T* x, int64_t rows, int64_t ld, const float* sh, float* s1,
                                    float* s2) {
  if constexpr (NV == 0) {
    return false;
  } else {
    if (nv != NV) return gn_rows_sums_in_registers_upto<I, NV - 1>(nv, x, rows, ld, sh, s1, s2);
    gn_rows_sums_in_registers<I, NV>(x, rows, ld, sh, s1, s2);
    return true;
  }
}

// s1[c] += sum over rows of (x[r, c] - sh[c]), s2[c] += ... squared, for `rows` rows of the C
// channels at x, rows `ld` elements apart. Row-major, four rows at a time: four sequential
// streams that the hardware prefetchers follow (walking down the columns instead stalls on every
// row), with the per-channel sums in registers where a row is at most 8 vectors of 16 floats
// (4 of 8: the AVX2 register file is half as large); rows of up to 128 channels, 256 rows or
// more, in column blocks of that many vectors, one block's sums in registers over all the rows,
// then the next block's (each block reads its own cache lines of every row); else in L1, loaded
// and stored once per eight rows (below). The same additions in the same order either
// way, so the same bits. Column blocks against sums in L1, whole forward, AVX2, AMD EPYC Zen 3,
// 2 threads, channels-last, old and new side by side in one process, time over a copy loop's
// (five to seven runs each): C = 64 4,64,128,128 1.37-1.74 -> 1.19-1.37 (each run 12-22%
// faster), 2,64,64,64 2.26-2.39 -> 2.07-2.17 (8-10%), 32,64,32,32 1.20-1.68 -> 1.19-1.57 (six
// of seven faster by 5-12%); C = 96 2,96,64,64 2.03-2.44 -> 1.86-2.18 (8-11%); C = 128
// 16,128,32,32 1.01-1.75 -> 0.92-1.66 (3-9%), 2,128,64,64 1.83-2.32 -> 1.74-2.12 (five of six
// faster by 2-9%). Not for longer rows: C = 256 and 512 no faster (8,256,32,32,
// 2,256,64,64, 1,512,64,64 within 2%), and at 5 KB a row (2,1280,8,8) 3.32 -> 3.76; nor for
// fewer rows, where setting up each block's registers weighs: 4,96,4,4 6.51-6.97 -> 6.95-7.52.
template <class I, class T>
void gn_rows_sums_periodic(const T* x, int64_t rows, int64_t C, int64_t period, const float* sh, float* s1, float* s2,
                           float* scratch);

template <class I, class T>
void gn_rows_sums(const T* x, int64_t rows, int64_t C, int64_t ld, const float* sh, float* s1, float* s2,
                  float* periods = nullptr) {
  using V = typename I::V;
  constexpr int W = I::W;
  const int64_t cv = C / W * W;
  const int tail = static_cast<int>(C - cv);
  constexpr int kMaxRegisterVectors = W >= 16 ? 8 : 4;
  if (tail == 0 && gn_rows_sums_in_registers_upto<I, kMaxRegisterVectors>(C / W, x, rows, ld, sh, s1, s2)) return;
  const int64_t period = C == ld && tail > 0 && periods != nullptr ? gn_nhwc_period(C, W) : 0;
  if (period > 0 && rows * C >= period) {
    gn_rows_sums_periodic<I>(x, rows, C, period, sh, s1, s2, periods);
    return;
  }
  if (tail == 0 && C <= 128 && rows >= 256) {
    for (int64_t c0 = 0; c0 < C; c0 += kMaxRegisterVectors * W) {
      const int64_t nv = gn_min(int64_t{kMaxRegisterVectors}, (C - c0) / W);
      gn_rows_sums_in_registers_upto<I, kMaxRegisterVectors>(nv, x + c0, rows, ld, sh + c0, s1 + c0, s2 + c0);
    }
    return;
  }
  // `steps` steps of four rows from x0 for every channel, each sum loaded and stored once for all
  // of them. Two steps (eight rows) where there are enough rows: loading and storing both sums
  // every four rows had the statistics at 2x the time of a plain read of x. Measured on an AMD
  // EPYC Zen 3 (AVX2, 2 threads, one 2 MiB sample each, the passes alone side by side in one
  // process): C = 128 1.07-1.24x -> 0.86-1.00x a copy, C = 64 1.34-1.41x -> 1.06x, C = 512
  // (8 MiB samples) 0.62-1.13x -> 0.47-0.82x. Sixteen rows were no faster than eight. The same
  // additions in the same order either way.
  const auto four_row_steps = [&](const T* x0, auto steps) {
    for (int64_t c = 0; c < cv; c += W) {
      V a = I::load(s1 + c), q = I::load(s2 + c);
      const V s = I::load(sh + c);
      for (int k = 0; k < steps(); ++k) gn_four_rows_sums<I>(x0 + 4 * k * ld + c, ld, s, &a, &q);
      I::store(s1 + c, a);
      I::store(s2 + c, q);
    }
    if (tail > 0) {
      const V s = I::load_n(sh + cv, tail);
      V a = I::load_n(s1 + cv, tail), q = I::load_n(s2 + cv, tail);
      for (int j = 0; j < 4 * steps(); ++j) {
        const V d = I::sub_n(I::load_n(x0 + j * ld + cv, tail), s, tail);
        a = I::add(a, d);
        q = I::fmadd(d, d, q);
      }
      I::store_n(s1 + cv, a, tail);
      I::store_n(s2 + cv, q, tail);
    }
  };
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) four_row_steps(x + r * ld, std::integral_constant<int, 2>());
  for (; r + 4 <= rows; r += 4) four_row_steps(x + r * ld, std::integral_constant<int, 1>());
  for (; r < rows; ++r) {
    const T* xr = x + r * ld;
    for (int64_t c = 0; c < cv; c += W) {
      V a = I::load(s1 + c), q = I::load(s2 + c);
      gn_one_row_sums<I>(xr + c, I::load(sh + c), &a, &q);
      I::store(s1 + c, a);
      I::store(s2 + c, q);
    }
    if (tail > 0) {
      const V d = I::sub_n(I::load_n(xr + cv, tail), I::load_n(sh + cv, tail), tail);
      I::store_n(s1 + cv, I::add(I::load_n(s1 + cv, tail), d), tail);
      I::store_n(s2 + cv, I::fmadd(d, d, I::load_n(s2 + cv, tail)), tail);
    }
  }
}

// gn_rows_sums for whole rows of C channels that are no whole number of vectors (the rows
// contiguous, period = gn_nhwc_period(C, W) > 0; scratch: 3 * period floats): the run of
// rows * C elements summed as rows of `period` elements (whole vectors), each position's sums
// then added into its channel's; the rows left over (less than a period) row by row. Row by row, each row's last channels took masked
// loads, and its sums masked loads and stores: channels-last forward, AVX2, AMD EPYC Zen 3,
// 2 threads, this and the normalization's periods against the previous code side by side in one
// program (benchmarks/cpp/group_norm_ab.sh), G = 4: 2,12,100,100 0.07-0.11 of the time,
// 2,20,64,64 0.12-0.13, 2,36,64,64 0.19-0.22, 1,12,256,256 0.07-0.09 (10-37x a copy -> 1.9-3.2x).
template <class I, class T>
void gn_rows_sums_periodic(const T* x, int64_t rows, int64_t C, int64_t period, const float* sh, float* s1, float* s2,
                           float* scratch) {
  float* psh = scratch;
  float* ps1 = scratch + period;
  float* ps2 = scratch + 2 * period;
  for (int64_t i = 0; i < period; ++i) {
    psh[i] = sh[i % C];
    ps1[i] = ps2[i] = 0.f;
  }
  const int64_t periods = rows * C / period, done = periods * period / C;
  gn_rows_sums<I>(x, periods, period, period, psh, ps1, ps2);
  for (int64_t i = 0; i < period; ++i) {
    s1[i % C] += ps1[i];
    s2[i % C] += ps2[i];
  }
  if (done < rows) gn_rows_sums<I>(x + done * C, rows - done, C, C, sh, s1, s2);
}

// Scratch memory of the [N, S, C] statistics of one tile or sample.
struct GnRowScratch {
  std::vector<float> sh, s1, s2;  // per channel: the shift (its group's) and the two sums
  std::vector<double> sd, sq;     // per group: the folded sums of a block
  std::vector<double> mean, m2;   // per group: the running moments (all groups share one count)
  std::vector<double> first;      // per channel: the sums of the first rows (first shifts)
  std::vector<float> periods;     // rows of no whole vector: gn_rows_sums_periodic's scratch
  GnRowScratch() = default;
  GnRowScratch(int64_t C, int64_t G) { reset(C, G); }
  // Sized for C channels in G groups (the users write every element before reading it; only
  // growth allocates).
  void reset(int64_t C, int64_t G) {
    for (auto* v : {&sh, &s1, &s2}) v->resize(static_cast<size_t>(C));
    for (auto* v : {&sd, &sq, &mean, &m2}) v->resize(static_cast<size_t>(G));
    first.resize(static_cast<size_t>(C));
    periods.resize(C % 16 != 0 ? static_cast<size_t>(3 * kGnMaxPeriod) : 0);
  }
  size_t bytes() const {
    return (sh.capacity() + s1.capacity() + s2.capacity() + periods.capacity()) * sizeof(float) +
           (sd.capacity() + sq.capacity() + mean.capacity() + m2.capacity() + first.capacity()) * sizeof(double);
  }
};

// sum of p[0..n) in double, in four independent chains (one chain of dependent double adds per
// group costs ~4 cycles an element: with many channels and few rows, as in (2, 1280, 8, 8), the
// per-group sums of every block were a third of the statistics' time).
template <class I, class T>
double gn_sum_double(const T* p, int64_t n) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += static_cast<double>(I::to_f32(p[i]));
    s1 += static_cast<double>(I::to_f32(p[i + 1]));
    s2 += static_cast<double>(I::to_f32(p[i + 2]));
    s3 += static_cast<double>(I::to_f32(p[i + 3]));
  }
  for (; i < n; ++i) s0 += static_cast<double>(I::to_f32(p[i]));
  return (s0 + s1) + (s2 + s3);
}

// The first shift of each group of a [N, S, C] sample or tile (sh[c] for every channel): the mean
// of the group's elements in the first rows, at least kGnFirstShiftElems of them (one row where a
// group has that many channels).
template <class I, class T>
void gn_nhwc_first_shifts(const T* x, int64_t rows, int64_t C, int64_t G, float* sh, double* acc) {
  const int64_t Cg = C / G;
  const int64_t k = gn_min(rows, (kGnFirstShiftElems + Cg - 1) / Cg);
  for (int64_t c = 0; c < C; ++c) acc[c] = static_cast<double>(I::to_f32(x[c]));
  for (int64_t r = 1; r < k; ++r) {
    for (int64_t c = 0; c < C; ++c) acc[c] += static_cast<double>(I::to_f32(x[r * C + c]));
  }
  for (int64_t g = 0; g < G; ++g) {
    double sum = 0.0;
    for (int64_t ci = 0; ci < Cg; ++ci) sum += acc[g * Cg + ci];
    const float shift = static_cast<float>(sum / static_cast<double>(k * Cg));
    for (int64_t ci = 0; ci < Cg; ++ci) sh[g * Cg + ci] = shift;
  }
}

// The per-channel sums gn_nhwc_moments takes over the rows of a block: x's only (the forward).
// A policy with the same members can take more sums in the same read (the backward's
// GnBwdDySums): max_block_rows() (see kGnRowBlockElems); start(sh) once the first shifts are
// set; sum(r0, nr, c0, width, sh, s1, s2) adds the rows [r0, r0 + nr) of the channels
// [c0, c0 + width) into s1 / s2 (zeroed by the caller); end_block(sh) once a block's shifts are
// final.
template <class I, class T>
struct GnXSums {
  // gn_rows_sums adds the deviations of four rows into each per-channel sum at a time, so four
  // times as many rows as one-row-per-addition sums take the same number of additions.
  static int64_t max_block_rows() { return 4 * kGnMaxBlockRows; }
  const T* x;
  int64_t C;
  float* periods = nullptr;  // gn_rows_sums' scratch for rows of no whole vector (GnRowScratch::periods)
  void start(const float*) {}
  void sum(int64_t r0, int64_t nr, int64_t c0, int64_t width, const float* sh, float* s1, float* s2) {
    gn_rows_sums<I>(x + r0 * C + c0, nr, width, C, sh + c0, s1 + c0, s2 + c0, periods);
  }
  void end_block(const float*) {}
};

// Moments per group (out[0..G)) of `rows` rows of C channels (see the header comment), with the
// per-channel sums of `sums` (GnXSums: x's alone).
template <class I, class T, class Sums>
void gn_nhwc_moments(const T* x, int64_t rows, int64_t C, int64_t G, GnMoments* out, GnRowScratch* sc, Sums& sums) {
  const int64_t Cg = C / G;
  float* sh = sc->sh.data();
  float* s1 = sc->s1.data();
  float* s2 = sc->s2.data();
  double* sd = sc->sd.data();
  double* sq = sc->sq.data();
  double* mean = sc->mean.data();
  double* m2 = sc->m2.data();
  double count = 0.0;
  for (int64_t g = 0; g < G; ++g) mean[g] = m2[g] = 0.0;
  gn_nhwc_first_shifts<I>(x, rows, C, G, sh, sc->first.data());
  sums.start(sh);
  const int64_t block_rows = gn_max(1, gn_min(sums.max_block_rows(), kGnRowBlockElems / C));
  // Sums of the channels [c0, c0 + width) of the block, folded per group.
  const auto block_sums = [&](int64_t r0, int64_t nr, int64_t c0, int64_t width) {
    for (int64_t c = c0; c < c0 + width; ++c) s1[c] = s2[c] = 0.f;
    sums.sum(r0, nr, c0, width, sh, s1, s2);
    for (int64_t g = c0 / Cg; g < (c0 + width) / Cg; ++g) {
      sd[g] = gn_sum_double<I>(s1 + g * Cg, Cg);
      sq[g] = gn_sum_double<I>(s2 + g * Cg, Cg);
    }
  };
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    const int64_t nr = gn_min(block_rows, rows - r0);
    const double nb = static_cast<double>(nr * Cg);
    block_sums(r0, nr, 0, C);
    for (int64_t g = 0; g < G; ++g) {
      if (gn_needs_recentering(nb, sd[g], sq[g])) {
        // Sum this group's channels of the block again (from cache) around its own mean.
        const float shift = static_cast<float>(static_cast<double>(sh[g * Cg]) + sd[g] / nb);
        for (int64_t ci = 0; ci < Cg; ++ci) sh[g * Cg + ci] = shift;
        block_sums(r0, nr, g * Cg, Cg);
      }
    }
    sums.end_block(sh);
    // Chan's merge of every group's block: all groups have the same
    // counts, so the weights are computed once per block and the loop over groups has no
    // division (with many groups of few channels, as (64, 32, 32, 32), per-group merges with
    // divisions took more time than the block's sums).
    const double total = count + nb, inv_nb = 1.0 / nb, w_new = nb / total, w_cross = count * nb / total;
    for (int64_t g = 0; g < G; ++g) {
      double mb = 0.0, m2b = 0.0;
      gn_block_moments(sh[g * Cg], sd[g], sq[g], inv_nb, &mb, &m2b);
      gn_chan_update(&mean[g], &m2[g], mb, m2b, w_new, w_cross);
    }
    count = total;
    for (int64_t g = 0; g < G; ++g) {
      const float shift = static_cast<float>(mean[g]);
      for (int64_t ci = 0; ci < Cg; ++ci) sh[g * Cg + ci] = shift;
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    out[g].count = count;
    out[g].mean = mean[g];
    out[g].m2 = m2[g];
  }
}

template <class I, class T>
void gn_nhwc_moments(const T* x, int64_t rows, int64_t C, int64_t G, GnMoments* out, GnRowScratch* sc) {
  GnXSums<I, T> sums{x, C, sc->periods.empty() ? nullptr : sc->periods.data()};
  gn_nhwc_moments<I>(x, rows, C, G, out, sc, sums);
}

// k's coefficients of C channels repeated over a period (GnCoefficients::pmh ...), where rows of
// C channels have one.
template <class I>
void gn_fill_periods(GnCoefficients* k, int64_t C) {
  const int64_t period = gn_nhwc_period(C, I::W);
  k->pmh.resize(static_cast<size_t>(period));
  k->pa.resize(static_cast<size_t>(period));
  k->poff.resize(static_cast<size_t>(period));
  for (int64_t i = 0; i < period; ++i) {
    k->pmh[i] = k->mh[i % C];
    k->pa[i] = k->a[i % C];
    k->poff[i] = k->off[i % C];
  }
}

// Coefficients of every channel of one sample from its groups' moments (mean, rstd per group).
// Fills mean_out / rstd_out ([G], may be null).
template <class I, class T>
void gn_sample_coefficients(const group_norm_isa::Args<T>& a, const GnMoments* m, float* mean_out, float* rstd_out,
                            GnCoefficients* k) {
  const int64_t C = a.d.C, G = a.d.G, Cg = C / G;
  k->mh.resize(static_cast<size_t>(C));
  k->a.resize(static_cast<size_t>(C));
  k->off.resize(static_cast<size_t>(C));
  k->exact.clear();
  k->exact_mean.clear();
  k->exact_scale.clear();
  k->exact_bias.clear();
  for (int64_t g = 0; g < G; ++g) {
    const double mean = m[g].mean;
    const double rstd = 1.0 / std::sqrt(m[g].m2 / m[g].count + a.eps);
    if (mean_out != nullptr) mean_out[g] = static_cast<float>(mean);
    if (rstd_out != nullptr) rstd_out[g] = static_cast<float>(rstd);
    for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) {
      double scale = 0.0, b = 0.0;
      if (!gn_channel_coefficients<I>(a.weight, a.bias, c, mean, rstd, &k->mh[c], &k->a[c], &k->off[c], &scale,
                                      &b)) {
        k->exact.push_back(c);
        k->exact_mean.push_back(mean);
        k->exact_scale.push_back(scale);
        k->exact_bias.push_back(b);
      }
    }
  }
  gn_fill_periods<I>(k, C);
}

// gn_nhwc_apply's rows of C channels that are no whole number of vectors (k.pmh not empty,
// ordinary stores), as one run of rows * C elements in periods of whole vectors (k.pmh.size()
// elements, whole rows): no row ends in a masked load and store. Four periods per load of the coefficients where
// there are four. The same arithmetic on every element as row by row. Returns the rows done (the
// rest, less than a period, are left to the caller).
template <class I, Activation A, class T>
int64_t gn_nhwc_apply_periods(const T* x, T* y, int64_t rows, int64_t C, const GnCoefficients& k, const T* next) {
  using V = typename I::V;
  constexpr int W = I::W;
  const int64_t P = static_cast<int64_t>(k.pmh.size()), n = rows * C;
  const float* pm = k.pmh.data();
  const float* pa = k.pa.data();
  const float* po = k.poff.data();
  int64_t i = 0;
  for (; i + 4 * P <= n; i += 4 * P) {
    if (next != nullptr) gn_prefetch(next + i, 4 * P * static_cast<int64_t>(sizeof(T)));
    for (int64_t v = 0; v < P; v += W) {
      V xv[4];
      for (int j = 0; j < 4; ++j) xv[j] = I::load(x + i + j * P + v);
      const V m0 = I::load(pm + v), a0 = I::load(pa + v), o0 = I::load(po + v);
      for (int j = 0; j < 4; ++j) {
        gn_store<I, false>(y + i + j * P + v, gn_act<I, A>(I::fmadd(I::sub(xv[j], m0), a0, o0)));
      }
    }
  }
  for (; i + P <= n; i += P) {
    for (int64_t v = 0; v < P; v += W) {
      gn_store<I, false>(y + i + v, gn_act<I, A>(I::fmadd(I::sub(I::load(x + i + v), I::load(pm + v)),
                                                          I::load(pa + v), I::load(po + v))));
    }
  }
  return i / C;
}

// Normalizes `rows` rows of C channels with per-channel coefficients. Stream: non-temporal
// stores, for rows that all start at the same offset from a vector boundary (C * sizeof(T) a
// multiple of the vector's bytes); the first `head` channels of each row are stored normally.
// next: rows to prefetch meanwhile (the next sample, whose statistics come next), or nullptr.
// cached: x was just read into this thread's L2 (a whole sample's statistics, just before).
template <class I, Activation A, bool Stream, class T>
void gn_nhwc_apply(const T* x, T* y, int64_t rows, int64_t C, const GnCoefficients& k, Activation act,
                   const T* next, bool cached) {
  constexpr int W = I::W;
  const float* mh = k.mh.data();
  const float* ka = k.a.data();
  const float* ko = k.off.data();
  using V = typename I::V;
  const auto g = [&](V v, int64_t c) {
    return gn_act<I, A>(I::fmadd(I::sub(v, I::load(mh + c)), I::load(ka + c), I::load(ko + c)));
  };
  const auto f = [&](const T* xr, int64_t c) { return g(I::load(xr + c), c); };
  const auto f_n = [&](const T* xr, int64_t c, int n) {
    return gn_act<I, A>(I::fmadd(I::sub(I::load_n(xr + c, n), I::load_n(mh + c, n)), I::load_n(ka + c, n),
                                 I::load_n(ko + c, n)));
  };
  const int64_t head = Stream ? gn_min(C, gn_unaligned_head<I>(y)) : 0;
  // Channels [c0, C) of row r.
  const auto row = [&](int64_t r, int64_t c0) {
    const T* xr = x + r * C;
    T* yr = y + r * C;
    int64_t c = c0;
    for (; c + 4 * W <= C; c += 4 * W) {
      // x's four loads issued before the arithmetic, as in a copy loop. One vector at a time, the
      // normalization alone took 1.6-2.1x a copy from the L3 and 1.2-1.5x with four (AVX2, AMD
      // EPYC Zen 3, 2 threads, C = 128 in 2 MiB samples, ordinary stores, side by side in one
      // process); streamed from memory (C = 256, 512 in 8 MiB samples) 0.74-0.82x -> 0.54-0.80x.
      const V x0 = I::load(xr + c), x1 = I::load(xr + c + W);
      const V x2 = I::load(xr + c + 2 * W), x3 = I::load(xr + c + 3 * W);
      gn_store4<I, Stream>(yr, c, g(x0, c), g(x1, c + W), g(x2, c + 2 * W), g(x3, c + 3 * W));
    }
    for (; c + W <= C; c += W) gn_store<I, Stream>(yr + c, f(xr, c));
    if (c < C) {
      const int n = static_cast<int>(C - c);
      I::store_n(yr + c, f_n(xr, c, n), n);
    }
  };
  int64_t r = 0;
  if constexpr (!Stream) {
    const int64_t period = static_cast<int64_t>(k.pmh.size());
    if (period > 0 && rows * C >= period) r = gn_nhwc_apply_periods<I, A>(x, y, rows, C, k, next);
  }
  // Four rows per load of the coefficients: six coefficient loads (two channel vectors' mean,
  // scale and offset) serve eight vectors of x, where one row at a time each vector of x took
  // three loads of its own (the same arithmetic on each element, so the same bits).
  // Channels-last 2,128,64,64: 2.06-2.56x -> 1.96-2.42x a copy, eight of nine runs faster by
  // 3-13% (whole forward, AVX2, AMD EPYC Zen 3, 2 threads, the two versions side by side in one
  // process). Not with SiLU, whose temporaries then no longer fit the registers (3-4% slower).
  // With streaming stores only where x is in this thread's L2 (`cached`: one sample's statistics
  // just read it) and four rows span at most 1 KiB: there 64,32,32,32 took 1.17-1.87x ->
  // 1.11-1.86x a copy (four of five runs faster, by 5-13%), 32,64,32,32 1.35-1.94x -> 1.31-1.99x
  // (four of five, 2-5%), 96,32,32,32 0.91-1.03x -> 0.89-0.92x (three of three). Where x comes
  // from the L3 (the normalization of tiles), streamed, it was slower: 4,64,128,128 1.62-1.72x ->
  // 2.02-2.07x, 1,512,64,64 twice the time (cause not found).
  // With ordinary stores and 8-float vectors (AVX2; the SSE2 baseline's pairs), one vector of
  // channels of the four rows per step: three coefficient loads for four vectors of x. The
  // two-vector step keeps eight vectors of x and six of coefficients live, more than the sixteen
  // registers, and spilled two of them every step. Forward, channels-last, side by side with the
  // two-vector step in one process (AVX2, AMD EPYC Zen 3, 2 threads, time / the other's, medians
  // of 21 rounds, three to eight runs): 2,128,64,64 0.93-0.98, 3,128,64,64 0.91-1.04 (seven of
  // eight faster), 2,64,64,64 0.91-1.00, 2,96,64,64 0.98-1.00, 4,64,32,32 0.96-1.00, 2,1280,8,8
  // 1.00-1.01; the same bits. With streaming stores a step keeps writing whole lines (two vectors
  // of a row), and 16-float vectors (AVX-512, 32 registers) keep the two-vector step.
  if constexpr (!Stream && W == 8) {
    // Any activation: with SiLU the step's temporaries fit the registers too (one row at a time,
    // three coefficient loads per vector of x, it took 1.01-1.16x the time: 2,64,64,64 + SiLU
    // 0.86-0.87 after / before, 2,320,32,32 0.93-0.95, 2,128,64,64 0.91-1.00, 3,128,64,64
    // 0.98-0.99; same machine and program as above, the same bits).
    for (; r + 4 <= rows; r += 4) {
      const T* xr = x + r * C;
      T* yr = y + r * C;
      if (next != nullptr) gn_prefetch(next + r * C, 4 * C * static_cast<int64_t>(sizeof(T)));
      const int64_t cv = C - C % W;
      for (int64_t c = 0; c < cv; c += W) {
        V v[4];
        for (int j = 0; j < 4; ++j) v[j] = I::load(xr + j * C + c);
        const V m0 = I::load(mh + c), a0 = I::load(ka + c), o0 = I::load(ko + c);
        for (int j = 0; j < 4; ++j) {
          gn_store<I, false>(yr + j * C + c, gn_act<I, A>(I::fmadd(I::sub(v[j], m0), a0, o0)));
        }
      }
      if (cv < C) {
        for (int j = 0; j < 4; ++j) row(r + j, cv);
      }
    }
  } else if constexpr (A == Activation::kNone) {
    if (!Stream || (cached && head == 0 && 4 * C * static_cast<int64_t>(sizeof(T)) <= 1024)) {
      const int64_t cb = C - C % (2 * W);
      for (; r + 4 <= rows; r += 4) {
        const T* xr = x + r * C;
        T* yr = y + r * C;
        if (next != nullptr) gn_prefetch(next + r * C, 4 * C * static_cast<int64_t>(sizeof(T)));
        for (int64_t c = 0; c < cb; c += 2 * W) {
          V v[8];
          for (int j = 0; j < 4; ++j) {
            v[2 * j] = I::load(xr + j * C + c);
            v[2 * j + 1] = I::load(xr + j * C + c + W);
          }
          const V m0 = I::load(mh + c), m1 = I::load(mh + c + W);
          const V a0 = I::load(ka + c), a1 = I::load(ka + c + W);
          const V o0 = I::load(ko + c), o1 = I::load(ko + c + W);
          for (int j = 0; j < 4; ++j) {
            gn_store<I, Stream>(yr + j * C + c, I::fmadd(I::sub(v[2 * j], m0), a0, o0));
            gn_store<I, Stream>(yr + j * C + c + W, I::fmadd(I::sub(v[2 * j + 1], m1), a1, o1));
          }
        }
        if (cb < C) {
          for (int j = 0; j < 4; ++j) row(r + j, cb);
        }
      }
    }
  }
  for (; r < rows; ++r) {
    if (next != nullptr) gn_prefetch(next + r * C, C * static_cast<int64_t>(sizeof(T)));
    if (head > 0) I::store_n(y + r * C, f_n(x + r * C, 0, static_cast<int>(head)), static_cast<int>(head));
    row(r, head);
  }
  for (size_t e = 0; e < k.exact.size(); ++e) {
    const int64_t c = k.exact[e];
    gn_apply_exact<I>(x + c, y + c, rows, C, k.exact_mean[e], k.exact_scale[e], k.exact_bias[e], act);
  }
}

template <class I, Activation A, class T>
void gn_forward_nhwc(const group_norm_isa::Args<T>& a, const ParallelFor& pf) {
  const int64_t N = a.d.N, C = a.d.C, G = a.d.G, S = a.d.S;
  const int64_t row_bytes = C * static_cast<int64_t>(sizeof(T));
  const int64_t sample_bytes = S * row_bytes;
  // Streaming stores need every row at the same offset from a vector boundary (gn_nhwc_apply).
  const bool stream = N * sample_bytes >= a.stream_bytes && C % I::W == 0;
  const auto apply = [&](const T* x, T* y, int64_t rows, const GnCoefficients& k, const T* next, bool cached) {
    if (stream) {
      gn_nhwc_apply<I, A, true>(x, y, rows, C, k, a.act, next, cached);
    } else {
      gn_nhwc_apply<I, A, false>(x, y, rows, C, k, a.act, next, cached);
    }
  };
  const auto stats_out = [&](float* p, int64_t n) { return p == nullptr ? nullptr : p + n * G; };
  const int64_t budget = stream ? a.cache_budget_streamed : a.cache_budget;

  if (sample_bytes <= budget && N >= kGnMinSampleTasks) {
    // One task per sample: statistics, then normalization from cache.
    const int64_t grain = gn_max(1, kGnMinTaskElems / gn_max(1, S * C));
    pf(N, grain, [&](int64_t begin, int64_t end) {
      GnRowScratch sc(C, G);
      std::vector<GnMoments> m(static_cast<size_t>(G));
      GnCoefficients k;
      for (int64_t n = begin; n < end; ++n) {
        const T* xs = a.x + n * S * C;
        gn_nhwc_moments<I>(xs, S, C, G, m.data(), &sc);
        gn_sample_coefficients<I>(a, m.data(), stats_out(a.mean, n), stats_out(a.rstd, n), &k);
        // The next sample is read into cache while this one is written (as for [N, C, S] groups).
        apply(xs, a.y + n * S * C, S, k, n + 1 < N ? xs + S * C : nullptr, true);
      }
      if (stream) I::fence();
    });
    return;
  }

  // Waves of samples cut into tiles of rows: statistics of all tiles, merge, normalization.
  int64_t tiles_per_sample = 0;
  const int64_t tile_rows = gn_tile_rows(S, row_bytes, &tiles_per_sample);
  // A wave holds as many samples as the L2s of two threads (4 budgets): its tiles are spread
  // over the threads, so each thread's part of it stays in its own L2 between the passes. Each
  // wave costs two parallel passes, which weigh on small tensors: (2, 320, 32, 32)
  // channels-last took 1.8-2.2x a copy in two waves of one sample (with waves of two budgets),
  // 1.3-1.6x in one wave (C++ harness, Xeon, 2 threads).
  // Where the L3 holds more than that (a.wave_bytes), waves are as large as it allows.
  const int64_t wave_samples = gn_max(1, gn_min(N, gn_max(4 * budget, a.wave_bytes) / gn_max(1, sample_bytes)));
  std::vector<GnMoments> partial(static_cast<size_t>(wave_samples * tiles_per_sample * G));
  for (int64_t n0 = 0; n0 < N; n0 += wave_samples) {
    const int64_t ns = gn_min(wave_samples, N - n0);
    const int64_t tiles = ns * tiles_per_sample;
    const auto tile_range = [&](int64_t t, int64_t* n, int64_t* r0, int64_t* nr) {
      *n = n0 + t / tiles_per_sample;
      *r0 = (t % tiles_per_sample) * tile_rows;
      *nr = gn_min(tile_rows, S - *r0);
    };
    pf(tiles, 1, [&](int64_t begin, int64_t end) {
      GnRowScratch sc(C, G);
      for (int64_t t = begin; t < end; ++t) {
        int64_t n = 0, r0 = 0, nr = 0;
        tile_range(t, &n, &r0, &nr);
        gn_nhwc_moments<I>(a.x + (n * S + r0) * C, nr, C, G, partial.data() + t * G, &sc);
      }
    });
    pf(tiles, 1, [&](int64_t begin, int64_t end) {
      // Each range merges the moments and computes the coefficients of the samples it touches
      // (in parallel, where a serial step between the passes took 4 us a sample at C = 1280);
      // the range that holds a sample's first tile stores its statistics.
      std::vector<GnMoments> merged(static_cast<size_t>(G));
      GnCoefficients k;
      int64_t have = -1;
      // Last tile first: the statistics pass just read this range in order, so its end is what
      // is still in this thread's L2 (with a static partition, as torch's pool makes); going
      // backwards reads that part from cache before the rest evicts it (measured on the Xeon:
      // 1,512,64,64 channels-last 1.69x -> 1.47x a copy; no change where everything fits).
      for (int64_t t = end - 1; t >= begin; --t) {
        int64_t n = 0, r0 = 0, nr = 0;
        tile_range(t, &n, &r0, &nr);
        if (n != have) {
          const int64_t j = n - n0;
          gn_merge_tiles(partial.data() + j * tiles_per_sample * G, tiles_per_sample, G, merged.data());
          const bool first_tile_here = j * tiles_per_sample >= begin;
          gn_sample_coefficients<I>(a, merged.data(), first_tile_here ? stats_out(a.mean, n) : nullptr,
                                    first_tile_here ? stats_out(a.rstd, n) : nullptr, &k);
          have = n;
        }
        apply(a.x + (n * S + r0) * C, a.y + (n * S + r0) * C, nr, k, nullptr, false);
      }
      if (stream) I::fence();
    });
  }
}

template <class I, class T>
void gn_forward(const group_norm_isa::Args<T>& a, const ParallelFor& pf) {
  if (a.d.N == 0 || a.d.C == 0) return;
  if (a.d.S == 0) {
    // Empty groups. N * G may be astronomically large here (x = [2^62, 1, 0] is a valid empty
    // tensor), so only touch the statistics when the caller asked for (and so allocated) them.
    if (a.mean != nullptr || a.rstd != nullptr) {
      for (int64_t ng = 0; ng < a.d.N * a.d.G; ++ng) {
        if (a.mean != nullptr) a.mean[ng] = 0.f;
        if (a.rstd != nullptr) a.rstd[ng] = 0.f;
      }
    }
    return;
  }
  gn_layout_and_act(a.d, a.act, [&](auto act, bool nhwc) {
    if (nhwc) {
      gn_forward_nhwc<I, decltype(act)::value>(a, pf);
    } else {
      gn_forward_nchw<I, decltype(act)::value>(a, pf);
    }
  });
}

}  // namespace
}  // namespace opbridge
