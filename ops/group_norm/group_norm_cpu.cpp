// GroupNorm CPU kernels: framework-free, and the op's CPU compute functions (opbridge/kernel.h),
// which the torch op, the ORT op and opbridge._core share.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

#include "common/simd_generic.h"
#include "group_norm_isa.h"
#include "group_norm_simd.h"
#include "group_norm_backward_simd.h"
#include "opbridge/cpu_isa.h"
#include "opbridge/dtype.h"
#include "group_norm.h"

namespace opbridge {

namespace {

// Elements summed in independent lanes before folding into a double. 16 lanes let the compiler
// keep several SIMD accumulators busy; a block of 2048 keeps each float partial sum short
// enough (<= 128 terms per lane) that its rounding error stays far below float epsilon * |sum|.
constexpr int kLanes = 16;
constexpr int64_t kBlock = 2048;

// Rows of a [N, S, C] tile in the scalar kernels (float64 forward, backward): ~64 KB of data,
// enough tiles per sample to balance the threads.
constexpr int64_t kTileBytes = int64_t{64} << 10;

// The size of the data or unified cache of `level` that the OS reports for CPU 0 (Linux sysfs),
// 0 where it reports none. glibc's sysconf(_SC_LEVEL3_CACHE_SIZE) is not used for the L3: on an
// AMD EPYC Zen 4 guest it said 320 MiB where sysfs (and CPUID leaf 0x8000001D) said 32 MiB.
int64_t sysfs_cache_bytes(int level) {
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream fl(dir + "level"), ft(dir + "type"), fs(dir + "size");
    if (!fl) break;
    int l = 0;
    std::string type, size;
    fl >> l;
    ft >> type;
    fs >> size;
    if (l != level || type == "Instruction" || size.empty()) continue;
    char* end = nullptr;
    const long long v = std::strtoll(size.c_str(), &end, 10);
    if (v <= 0) continue;
    const char unit = *end;
    return static_cast<int64_t>(v) * (unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : unit == 'G' ? 1 << 30 : 1);
  }
  return 0;
}

// A byte count from the environment variable `name` (digits with an optional K, M or G suffix),
// or -1 where it is unset or not such a number.
int64_t env_bytes(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (end == v || n < 0) return -1;
  const int64_t mult = *end == 'K' ? 1024 : *end == 'M' ? 1024 * 1024 : *end == 'G' ? int64_t{1} << 30 : 1;
  if (*end != '\0' && (end[1] != '\0' || mult == 1)) return -1;
  return static_cast<int64_t>(n) * mult;
}

GroupNormCpuChoices detect_choices() {
  GroupNormCpuChoices c;
  c.l2_bytes = sysfs_cache_bytes(2);
  c.l3_bytes = sysfs_cache_bytes(3);
#if defined(_SC_LEVEL2_CACHE_SIZE)
  if (c.l2_bytes <= 0) c.l2_bytes = std::max<long>(0, sysconf(_SC_LEVEL2_CACHE_SIZE));
#endif
  // The sizes the choices below are derived from, as another machine would report them: for
  // experiments, and for checking the derivation on any machine.
  const int64_t l2_set = env_bytes("OPBRIDGE_GROUP_NORM_L2_BYTES");
  const int64_t l3_set = env_bytes("OPBRIDGE_GROUP_NORM_L3_BYTES");
  if (l2_set >= 0) c.l2_bytes = l2_set;
  if (l3_set >= 0) c.l3_bytes = l3_set;
  // Half the per-core L2: what one thread may keep in cache between the statistics pass and the
  // normalization, leaving the rest for the output and everything else; 512 KB where the OS
  // reports nothing (every current x86 core has at least 1 MB of L2).
  c.cache_budget = c.l2_bytes <= 0 ? int64_t{512} << 10
                                   : std::clamp<int64_t>(c.l2_bytes / 2, int64_t{128} << 10, int64_t{8} << 20);
  // Where the output is streamed it takes no room in the L2, so x may have all of it. On an EPYC
  // Zen 4 (1 MB L2), 8,256,32,32 channels-last (1 MB samples) then runs one task per sample
  // instead of waves of tiles: 1.44-1.87x -> 0.88-1.15x a copy (forward, 2 threads, paired
  // single calls under load). With a 2 MB L2 (the Xeons) it lets a 2 MB channels-last sample
  // (2,128,64,64) run as one task from the L2 once its output is streamed.
  c.cache_budget_streamed = 2 * c.cache_budget;
  // Outputs too large to stay in the caches until the next op reads them are written with
  // streaming (non-temporal) stores: skipping the read-for-ownership of every output line saves a
  // third of the memory traffic. "Too large": at least the L2s of two cores and a quarter of the
  // L3 (x and y then fill half of it) where the L3 is one of at most 32 MiB, as an EPYC's
  // 8-core CCX reports; 4 MiB where the OS reports no L3 or a larger one, a mesh shared by
  // dozens of cores (the Xeons measured: 105 and 260 MiB, with 2 MiB L2s), where streaming paid
  // from 4 MiB. Measured (forward, fp32, 2 threads, 128 channels of 64x64, N = 1..12): on an
  // EPYC Zen 4 (1 MB L2, 32 MB L3) ordinary stores were faster up to 6 MB (1.7-1.9x a copy
  // against 3.2-3.3x streamed), streaming from 12 MB (1.05x against 1.9-2.0x), 8 MB either way;
  // on a Zen 5 (the same caches) streaming was 1.3-1.8x faster at 8-16 MB: 8 MiB. On a Xeon with
  // a 260 MB L3 streaming was 1.1-1.2x faster at 8 MB; on one with 105 MB (one-process A/B,
  // group_norm_ab.sh with AVX-512) streaming from 4 MiB instead of 8 MiB took 0.74-0.88 of the
  // time at 4-6 MiB channels-last (0.85-0.88 in the backward) and 0.90-1.0 contiguous, but
  // 1.09-1.14 contiguous with SiLU: 4 MiB.
  const bool l3_counted = c.l3_bytes > 0 && c.l3_bytes <= (int64_t{32} << 20);
  c.stream_bytes = std::max<int64_t>(2 * c.l2_bytes, l3_counted ? c.l3_bytes / 4 : int64_t{4} << 20);
  // Channels-last samples too large for the budget are cut into tiles and taken in waves: the
  // statistics of every tile of a wave, then their normalization. Half the L3 keeps a wave's x
  // there between the two passes (the other half for y and everything else), so fewer, larger
  // waves cost no extra reads from memory and fewer parallel passes. On the EPYC Zen 4 (32 MB L3),
  // 2,512,64,64 channels-last in one wave instead of two: 2.99-3.96x -> 1.69-1.99x a copy, and
  // 0.57-0.69x -> 1.00-1.17x F.group_norm's speed (paired single calls under load).
  c.wave_bytes = c.l3_bytes / 2;
  const int64_t budget = env_bytes("OPBRIDGE_GROUP_NORM_CACHE_BUDGET");
  const int64_t stream = env_bytes("OPBRIDGE_GROUP_NORM_STREAM_BYTES");
  const int64_t wave = env_bytes("OPBRIDGE_GROUP_NORM_WAVE_BYTES");
  const char* fuse = std::getenv("OPBRIDGE_GROUP_NORM_FUSE");
  const bool fuse_set = fuse != nullptr && (std::string(fuse) == "0" || std::string(fuse) == "1");
  if (fuse_set) c.fuse_groups = fuse[0] == '1';
  if (budget > 0) c.cache_budget = c.cache_budget_streamed = budget;
  if (stream >= 0) c.stream_bytes = stream;
  if (wave >= 0) c.wave_bytes = wave;
  c.overridden = budget > 0 || stream >= 0 || wave >= 0 || fuse_set || l2_set >= 0 || l3_set >= 0;
  return c;
}

// sum(term(x[i])) over n elements, accumulated in blocks of kBlock in kLanes lanes of the
// accumulation type, each block folded in double: the lanes vectorize, and no partial sum grows
// large enough to lose the small terms.
template <class T, class Term>
double blocked_sum(const T* x, int64_t n, const Term& term) {
  using A = acc_t<T>;
  double total = 0.0;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    A lanes[kLanes] = {};
    int64_t i = b0;
    for (; i + kLanes <= b1; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) lanes[l] += term(static_cast<A>(to_float(x[i + l])));
    }
    for (; i < b1; ++i) lanes[0] += term(static_cast<A>(to_float(x[i])));
    double s = 0.0;
    for (int l = 0; l < kLanes; ++l) s += static_cast<double>(lanes[l]);
    total += s;
  }
  return total;
}

// sum(x[i] - shift) over n elements.
template <class T>
double shifted_sum(const T* x, int64_t n, acc_t<T> shift) {
  return blocked_sum(x, n, [shift](acc_t<T> v) { return v - shift; });
}

// sum((x[i] - m)^2) over n elements.
template <class T>
double sum_sq_dev(const T* x, int64_t n, acc_t<T> m) {
  return blocked_sum(x, n, [m](acc_t<T> v) {
    const acc_t<T> d = v - m;
    return d * d;
  });
}

// The mean m as m_hi + m_lo: m_hi = m rounded to the accumulation type A, m_lo = m - m_hi
// exactly (in double). x - m_hi is exact for x near the mean (Sterbenz), so a large common
// offset costs no digits as long as m_lo is accounted for separately; rounding m to one float
// instead would shift every deviation by up to ulp(m) / 2 (0.03 at mean 1e6).
template <class A>
void split_mean(double m, A* hi, double* lo) {
  *hi = static_cast<A>(m);
  *lo = m - static_cast<double>(*hi);
}

// Mean and 1/sqrt(var + eps) of the contiguous group g[0..n). Two passes over data that is
// small enough to stay in cache: the first pass is shifted by g[0] so that a large common
// offset does not swamp the sum; the second takes deviations from the mean, so there is no
// E[x^2] - E[x]^2 cancellation: sum((x - m_hi)^2) = sum((x - m)^2) + n * m_lo^2, as
// sum(x - m) = 0.
template <class T>
void group_stats(const T* g, int64_t n, double eps, double* mean_out, double* rstd_out) {
  using A = acc_t<T>;
  const A shift = to_float(g[0]);
  const double mean = static_cast<double>(shift) + shifted_sum(g, n, shift) / static_cast<double>(n);
  A m_hi;
  double m_lo;
  split_mean(mean, &m_hi, &m_lo);
  double var = sum_sq_dev(g, n, m_hi) / static_cast<double>(n) - m_lo * m_lo;
  if (var < 0.0) var = 0.0;  // rounding; NaN passes through
  *mean_out = mean;
  *rstd_out = 1.0 / std::sqrt(var + eps);
}

// Per-tile moments of [N, S, C] data in the scalar kernels, two-pass per tile (the tile is in
// cache for the second pass): per group, the count, the mean and the sum of squared deviations,
// merged across tiles with Chan's formula (GnMoments). acc[C] is scratch.
template <class T>
void nhwc_tile_moments(const T* x, int64_t rows, int64_t C, int64_t G, GnMoments* out, std::vector<double>* acc) {
  using A = acc_t<T>;
  const int64_t Cg = C / G;
  acc->assign(static_cast<size_t>(C), 0.0);
  double* s = acc->data();
  std::vector<A> shift(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) shift[c] = to_float(x[(c / Cg) * Cg]);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < C; ++c) s[c] += static_cast<double>(to_float(x[r * C + c]) - shift[c]);
  }
  const double nb = static_cast<double>(rows * Cg);
  std::vector<double> mean(static_cast<size_t>(G));
  std::vector<A> m_hi(static_cast<size_t>(C));
  for (int64_t g = 0; g < G; ++g) {
    double sum = 0.0;
    for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) sum += s[c];
    mean[g] = static_cast<double>(shift[g * Cg]) + sum / nb;
    for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) m_hi[c] = static_cast<A>(mean[g]);
  }
  acc->assign(static_cast<size_t>(C), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      const double dv = static_cast<double>(to_float(x[r * C + c]) - m_hi[c]);
      s[c] += dv * dv;
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    double sq = 0.0;
    for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) sq += s[c];
    const double m_lo = mean[g] - static_cast<double>(m_hi[g * Cg]);
    double m2 = sq - nb * m_lo * m_lo;  // deviations were taken from m_hi, see group_stats
    if (m2 < 0.0) m2 = 0.0;
    out[g] = GnMoments();
    out[g].merge(nb, mean[g], m2);
  }
}

// The row tiles of the [N, S, C] scalar passes: kTileBytes of x each.
struct NhwcTiles {
  int64_t rows;        // rows per tile
  int64_t per_sample;  // tiles per sample
};
template <class T>
NhwcTiles nhwc_tiles(int64_t S, int64_t C) {
  const int64_t rows = std::max<int64_t>(1, kTileBytes / (C * static_cast<int64_t>(sizeof(T))));
  return {rows, (S + rows - 1) / rows};
}

// Runs row(t, n, off, k0, k1, k2) over every row of the [N, S, C] tensor (off: the row's first
// element), tile t by tile, tiles in parallel. k0..k2 are the per-channel coefficients of sample
// n, coef(n, c, &k0[c], &k1[c], &k2[c]), computed again only where a task's next tile starts
// another sample: once per sample and task, not once per tile.
template <class K, class Coef, class Row>
void nhwc_tile_rows(const NhwcTiles& tiles, int64_t N, int64_t S, int64_t C, const ParallelFor& pf,
                    const Coef& coef, const Row& row) {
  pf(N * tiles.per_sample, 1, [&](int64_t begin, int64_t end) {
    std::vector<K> k0(static_cast<size_t>(C)), k1(static_cast<size_t>(C)), k2(static_cast<size_t>(C));
    int64_t coef_n = -1;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n = t / tiles.per_sample, r0 = (t % tiles.per_sample) * tiles.rows;
      const int64_t r1 = std::min(S, r0 + tiles.rows);
      if (n != coef_n) {
        for (int64_t c = 0; c < C; ++c) coef(n, c, &k0[c], &k1[c], &k2[c]);
        coef_n = n;
      }
      for (int64_t r = r0; r < r1; ++r) row(t, n, (n * S + r) * C, k0.data(), k1.data(), k2.data());
    }
  });
}

// Mean and rstd of every (n, g) of x ([N, C, S] or [N, S, C]) into mean[N * G], rstd[N * G].
template <class T>
void all_group_stats(const T* x, const GroupNormDims& d, double eps, double* mean, double* rstd,
                     const ParallelFor& pf) {
  const int64_t N = d.N, C = d.C, G = d.G, S = d.S, Cg = C / G;
  if (!d.channels_last) {
    const int64_t ge = Cg * S;
    pf(N * G, std::max<int64_t>(1, kGnMinTaskElems / ge), [&](int64_t b, int64_t e) {
      for (int64_t ng = b; ng < e; ++ng) group_stats(x + ng * ge, ge, eps, &mean[ng], &rstd[ng]);
    });
    return;
  }
  const NhwcTiles tiles = nhwc_tiles<T>(S, C);
  const int64_t tps = tiles.per_sample;
  std::vector<GnMoments> partial(static_cast<size_t>(N * tps * G));
  pf(N * tps, 1, [&](int64_t b, int64_t e) {
    std::vector<double> acc;
    for (int64_t t = b; t < e; ++t) {
      const int64_t n = t / tps, r0 = (t % tps) * tiles.rows;
      nhwc_tile_moments(x + (n * S + r0) * C, std::min(tiles.rows, S - r0), C, G, partial.data() + t * G, &acc);
    }
  });
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      GnMoments m;
      for (int64_t t = 0; t < tps; ++t) m.merge(partial[(n * tps + t) * G + g]);
      mean[n * G + g] = m.mean;
      rstd[n * G + g] = 1.0 / std::sqrt(m.m2 / m.count + eps);
    }
  }
}

}  // namespace

const GroupNormCpuChoices& group_norm_cpu_choices() {
  static const GroupNormCpuChoices c = detect_choices();
  return c;
}

namespace group_norm_isa {
template <class T>
void run_baseline(const Args<T>& a, const ParallelFor& pf) {
  gn_forward<SimdGeneric, T>(a, pf);
}
template <class T>
void run_baseline(const BackwardArgs<T>& a, const ParallelFor& pf) {
  gn_backward<SimdGeneric, T>(a, pf);
}
}  // namespace group_norm_isa

namespace {

double act_double(Activation act, double z) { return act == Activation::kSilu ? z / (1.0 + std::exp(-z)) : z; }

// float64 keeps straightforward kernels: two passes over each group (or tile) in double.
Status group_norm_cpu_f64(const double* x, const double* weight, const double* bias, double* y,
                          const GroupNormDims& d, double eps, Activation act, double* mean, double* rstd,
                          const ParallelFor& pf) {
  const int64_t N = d.N, C = d.C, G = d.G, S = d.S;
  if (N <= 0 || C <= 0) return Status::Ok();
  if (S <= 0) {
    // Empty groups. N * G may be astronomically large here (x = [2^62, 1, 0] is a valid empty
    // tensor), so only touch the statistics when the caller asked for (and so allocated) them.
    if (mean != nullptr || rstd != nullptr) {
      for (int64_t ng = 0; ng < N * G; ++ng) {
        if (mean != nullptr) mean[ng] = 0.0;
        if (rstd != nullptr) rstd[ng] = 0.0;
      }
    }
    return Status::Ok();
  }
  const int64_t Cg = C / G;
  // y = (x - m) * a + b: folding m into the offset (x * a + (b - m * a)) would save a
  // subtraction but cancel catastrophically when a = rstd * w is large (variance << eps).
  const auto coef = [&](int64_t c, double r) { return r * (weight != nullptr ? weight[c] : 1.0); };
  const auto shift = [&](int64_t c) { return bias != nullptr ? bias[c] : 0.0; };
  if (!d.channels_last) {
    const int64_t group_elems = Cg * S;
    pf(N * G, std::max<int64_t>(1, kGnMinTaskElems / group_elems), [&](int64_t begin, int64_t end) {
      for (int64_t ng = begin; ng < end; ++ng) {
        const int64_t g = ng % G;
        const double* xg = x + ng * group_elems;
        double* yg = y + ng * group_elems;
        double m = 0.0, r = 0.0;
        group_stats(xg, group_elems, eps, &m, &r);
        if (mean != nullptr) mean[ng] = m;
        if (rstd != nullptr) rstd[ng] = r;
        for (int64_t ci = 0; ci < Cg; ++ci) {
          const int64_t c = g * Cg + ci;
          const double a = coef(c, r), b = shift(c);
          const double* xc = xg + ci * S;
          double* yc = yg + ci * S;
          for (int64_t i = 0; i < S; ++i) yc[i] = act_double(act, (xc[i] - m) * a + b);
        }
      }
    });
    return Status::Ok();
  }
  std::vector<double> gm(static_cast<size_t>(N * G)), gr(static_cast<size_t>(N * G));
  all_group_stats(x, d, eps, gm.data(), gr.data(), pf);
  if (mean != nullptr) std::copy(gm.begin(), gm.end(), mean);
  if (rstd != nullptr) std::copy(gr.begin(), gr.end(), rstd);
  nhwc_tile_rows<double>(
      nhwc_tiles<double>(S, C), N, S, C, pf,
      [&](int64_t n, int64_t c, double* m, double* a, double* b) {
        *m = gm[n * G + c / Cg];
        *a = coef(c, gr[n * G + c / Cg]);
        *b = shift(c);
      },
      [&](int64_t, int64_t, int64_t off, const double* m, const double* a, const double* b) {
        for (int64_t c = 0; c < C; ++c) y[off + c] = act_double(act, (x[off + c] - m[c]) * a[c] + b[c]);
      });
  return Status::Ok();
}

// dz = dy * act'(z) for the backward pass, z the pre-activation.
template <class A>
A act_grad(Activation act, A dy, A z) {
  if (act != Activation::kSilu) return dy;
  const A s = A(1) / (A(1) + std::exp(-z));
  return dy * (s * (A(1) + z * (A(1) - s)));
}

// The float64 backward: straightforward kernels in double. Writes dx (unless null), the
// per-channel sums ds, db ([N, C]) and rstd ([N, G]) as group_norm_isa::BackwardArgs describes.
template <class T>
void group_norm_backward_scalar(const T* dy, const T* x, const T* weight, const T* bias, T* dx,
                                const GroupNormDims& d, double eps, Activation act, double* ds, double* db,
                                double* grstd, const ParallelFor& pf) {
  using A = acc_t<T>;
  const int64_t N = d.N, C = d.C, G = d.G, S = d.S;
  const int64_t Cg = C / G;
  const double inv_m = 1.0 / static_cast<double>(Cg * S);
  const auto w_of = [&](int64_t c) { return weight != nullptr ? static_cast<double>(to_float(weight[c])) : 1.0; };
  const auto b_of = [&](int64_t c) { return bias != nullptr ? static_cast<double>(to_float(bias[c])) : 0.0; };

  // Group statistics, recomputed from x.
  std::vector<double> gmean(static_cast<size_t>(N * G));
  all_group_stats(x, d, eps, gmean.data(), grstd, pf);

  // Per (n, c): ds = sum(dz * (x - mean)), db = sum(dz), with dz = dy * act'(z). x - mean is
  // taken against the mean as m_hi + m_lo, as in the forward pass (no cancellation at large
  // offsets): sum(dz * (x - m)) = sum(dz * (x - m_hi)) - m_lo * sum(dz).
  // The pre-activation of element x of channel c in sample n: z = (x - m_hi) * za + zo.
  const auto pre = [&](int64_t n, int64_t c, A* m_hi, A* za, A* zo) {
    const double m = gmean[n * G + c / Cg], r = grstd[n * G + c / Cg];
    double m_lo;
    split_mean(m, m_hi, &m_lo);
    const double scale = r * w_of(c);
    *za = static_cast<A>(scale);
    *zo = static_cast<A>(b_of(c) - m_lo * scale);
  };
  if (!d.channels_last) {
    pf(N * C, std::max<int64_t>(1, kGnMinTaskElems / S), [&](int64_t begin, int64_t end) {
      for (int64_t nc = begin; nc < end; ++nc) {
        const int64_t n = nc / C, c = nc % C;
        A m_hi, za, zo;
        pre(n, c, &m_hi, &za, &zo);
        const T* xc = x + nc * S;
        const T* dyc = dy + nc * S;
        A l_ds[kLanes] = {}, l_db[kLanes] = {};
        double s_ds = 0.0, s_db = 0.0;
        for (int64_t b0 = 0; b0 < S; b0 += kBlock) {
          const int64_t b1 = std::min(S, b0 + kBlock);
          int64_t i = b0;
          const auto step = [&](int l, int64_t k) {
            const A xv = to_float(xc[k]) - m_hi;
            const A g = act_grad<A>(act, to_float(dyc[k]), xv * za + zo);
            l_ds[l] += g * xv;
            l_db[l] += g;
          };
          for (; i + kLanes <= b1; i += kLanes) {
            for (int l = 0; l < kLanes; ++l) step(l, i + l);
          }
          for (; i < b1; ++i) step(0, i);
          for (int l = 0; l < kLanes; ++l) {
            s_ds += static_cast<double>(l_ds[l]);
            s_db += static_cast<double>(l_db[l]);
            l_ds[l] = A(0);
            l_db[l] = A(0);
          }
        }
        double m_lo;
        A unused;
        split_mean(gmean[n * G + c / Cg], &unused, &m_lo);
        ds[nc] = s_ds - m_lo * s_db;
        db[nc] = s_db;
      }
    });
  } else {
    const NhwcTiles tiles = nhwc_tiles<T>(S, C);
    const int64_t tps = tiles.per_sample;
    std::vector<double> pds(static_cast<size_t>(N * tps * C)), pdb(static_cast<size_t>(N * tps * C));
    nhwc_tile_rows<A>(tiles, N, S, C, pf, pre,
                      [&](int64_t t, int64_t, int64_t off, const A* m_hi, const A* za, const A* zo) {
                        double* a_ds = pds.data() + t * C;
                        double* a_db = pdb.data() + t * C;
                        for (int64_t c = 0; c < C; ++c) {
                          const A xv = to_float(x[off + c]) - m_hi[c];
                          const A g = act_grad<A>(act, to_float(dy[off + c]), xv * za[c] + zo[c]);
                          a_ds[c] += static_cast<double>(g * xv);
                          a_db[c] += static_cast<double>(g);
                        }
                      });
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < C; ++c) {
        double s_ds = 0.0, s_db = 0.0;
        for (int64_t t = 0; t < tps; ++t) {
          s_ds += pds[(n * tps + t) * C + c];
          s_db += pdb[(n * tps + t) * C + c];
        }
        double m_lo;
        A unused;
        split_mean(gmean[n * G + c / Cg], &unused, &m_lo);
        ds[n * C + c] = s_ds - m_lo * s_db;
        db[n * C + c] = s_db;
      }
    }
  }

  if (dx != nullptr) {
    // dx = r * (w * dz - sum_dxhat / M - xhat * sum_dxhat_xhat / M), xhat = (x - m) * r, with
    // dxhat = dz * w summed over the group: per (n, c) coefficients c1 * dz + c2 * (x - m_hi) + c3.
    std::vector<A> c1(static_cast<size_t>(N * C)), c2(static_cast<size_t>(N * G)), c3(static_cast<size_t>(N * G));
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t g = 0; g < G; ++g) {
        const double r = grstd[n * G + g];
        double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
        for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) {
          sum_dxhat += w_of(c) * db[n * C + c];
          sum_dxhat_xhat += w_of(c) * ds[n * C + c] * r;
          c1[n * C + c] = static_cast<A>(r * w_of(c));
        }
        A m_hi;
        double m_lo;
        split_mean(gmean[n * G + g], &m_hi, &m_lo);
        const A k2 = static_cast<A>(-r * r * sum_dxhat_xhat * inv_m);
        c2[n * G + g] = k2;
        // x - m = (x - m_hi) - m_lo: the m_lo part folds into the constant term.
        c3[n * G + g] = static_cast<A>(-r * sum_dxhat * inv_m - static_cast<double>(k2) * m_lo);
      }
    }
    if (!d.channels_last) {
      pf(N * C, std::max<int64_t>(1, kGnMinTaskElems / S), [&](int64_t begin, int64_t end) {
        for (int64_t nc = begin; nc < end; ++nc) {
          const int64_t n = nc / C, c = nc % C, ng = n * G + c / Cg;
          A m_hi, za, zo;
          pre(n, c, &m_hi, &za, &zo);
          const T* xc = x + nc * S;
          const T* dyc = dy + nc * S;
          T* dxc = dx + nc * S;
          for (int64_t i = 0; i < S; ++i) {
            const A xv = to_float(xc[i]) - m_hi;
            const A g = act_grad<A>(act, to_float(dyc[i]), xv * za + zo);
            dxc[i] = from_acc<T>(c1[nc] * g + c2[ng] * xv + c3[ng]);
          }
        }
      });
    } else {
      nhwc_tile_rows<A>(nhwc_tiles<T>(S, C), N, S, C, pf, pre,
                        [&](int64_t, int64_t n, int64_t off, const A* m_hi, const A* za, const A* zo) {
                          for (int64_t c = 0; c < C; ++c) {
                            const int64_t ng = n * G + c / Cg;
                            const A xv = to_float(x[off + c]) - m_hi[c];
                            const A g = act_grad<A>(act, to_float(dy[off + c]), xv * za[c] + zo[c]);
                            dx[off + c] = from_acc<T>(c1[n * C + c] * g + c2[ng] * xv + c3[ng]);
                          }
                        });
    }
  }
}

}  // namespace

template <class T>
Status group_norm_cpu(const T* x, const T* weight, const T* bias, T* y, const GroupNormParams& p, acc_t<T>* mean,
                      acc_t<T>* rstd, const ParallelFor& pf, CpuIsa isa) {
  const GroupNormDims& d = p.d;
  const double eps = p.eps;
  const Activation act = p.act;
  OPBRIDGE_RETURN_IF_ERROR(cpu_isa_check(isa));
  if constexpr (std::is_same_v<T, double>) {
    return group_norm_cpu_f64(x, weight, bias, y, d, eps, act, mean, rstd, pf);
  } else {
    const GroupNormCpuChoices& ch = group_norm_cpu_choices();
    const group_norm_isa::Args<T> a{x,    weight, bias, y, d, eps, act, mean, rstd, ch.cache_budget,
                                    ch.cache_budget_streamed, ch.stream_bytes, ch.wave_bytes, ch.fuse_groups};
    cpu_isa_run(isa, a, pf);
    return Status::Ok();
  }
}

template <class T>
Status group_norm_backward_cpu(const T* dy, const T* x, const T* weight, const T* bias, T* dx, T* dweight, T* dbias,
                               const GroupNormParams& p, const ParallelFor& pf, CpuIsa isa) {
  OPBRIDGE_RETURN_IF_ERROR(cpu_isa_check(isa));
  const GroupNormDims& d = p.d;
  const double eps = p.eps;
  const Activation act = p.act;
  using A = acc_t<T>;
  const int64_t N = d.N, C = d.C, G = d.G, S = d.S;
  if (N <= 0 || C <= 0 || S <= 0) {
    // x is empty: dx is empty too and the parameter gradients are sums over nothing. Nothing of
    // size N * C is allocated: N may be huge when another dimension is 0.
    for (int64_t c = 0; c < C && (dweight != nullptr || dbias != nullptr); ++c) {
      if (dweight != nullptr) dweight[c] = from_acc<T>(A(0));
      if (dbias != nullptr) dbias[c] = from_acc<T>(A(0));
    }
    return Status::Ok();
  }
  const int64_t Cg = C / G;
  std::vector<double> ds(static_cast<size_t>(N * C)), db(static_cast<size_t>(N * C));
  std::vector<double> grstd(static_cast<size_t>(N * G));
  if constexpr (std::is_same_v<T, double>) {
    group_norm_backward_scalar(dy, x, weight, bias, dx, d, eps, act, ds.data(), db.data(), grstd.data(), pf);
  } else {
    const GroupNormCpuChoices& ch = group_norm_cpu_choices();
    const group_norm_isa::BackwardArgs<T> a{dy,        x,         weight,       bias,          dx, d, eps, act,
                                            ds.data(), db.data(), grstd.data(), ch.cache_budget,
                                            ch.stream_bytes};
    cpu_isa_run(isa, a, pf);
  }
  if (dweight != nullptr || dbias != nullptr) {
    // Group by group: a division per channel (c / Cg) took longer than the rest of this loop
    // (1280 of them, serial on the calling thread, a few µs at (2, 1280, 8, 8)).
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) {
        double sw = 0.0, sb = 0.0;
        for (int64_t n = 0; n < N; ++n) {
          sw += ds[n * C + c] * grstd[n * G + g];
          sb += db[n * C + c];
        }
        if (dweight != nullptr) dweight[c] = from_acc<T>(static_cast<A>(sw));
        if (dbias != nullptr) dbias[c] = from_acc<T>(static_cast<A>(sb));
      }
    }
  }
  return Status::Ok();
}

#define OPBRIDGE_INSTANTIATE_GROUP_NORM(T)                                                                   \
  template Status group_norm_cpu<T>(const T*, const T*, const T*, T*, const GroupNormParams&, acc_t<T>*, \
                                    acc_t<T>*, const ParallelFor&, CpuIsa);                              \
  template Status group_norm_backward_cpu<T>(const T*, const T*, const T*, const T*, T*, T*, T*,          \
                                             const GroupNormParams&, const ParallelFor&, CpuIsa);

OPBRIDGE_FOR_EACH_FLOAT_TYPE(OPBRIDGE_INSTANTIATE_GROUP_NORM)

// ---- the compute functions (opbridge/kernel.h) ------------------------------------------------

namespace {

Status forward(const KernelCall& k) {
  const GroupNormParams p = group_norm_params(k);
  return dispatch<float, double, Half, BFloat16>(k.type("x"), [&](auto tag) {
    using T = decltype(tag);
    return group_norm_cpu<T>(k.in<T>("x"), k.in<T>("weight"), k.in<T>("bias"), k.out<T>(0), p, nullptr, nullptr,
                             k.parallel(), k.isa());
  });
}

Status backward(const KernelCall& k) {
  const GroupNormParams p = group_norm_params(k);
  return dispatch<float, double, Half, BFloat16>(k.type("x"), [&](auto tag) {
    using T = decltype(tag);
    return group_norm_backward_cpu<T>(k.in<T>("grad"), k.in<T>("x"), k.in<T>("weight"), k.in<T>("bias"),
                                      k.out<T>(0), k.out<T>(1), k.out<T>(2), p, k.parallel(), k.isa());
  });
}

}  // namespace

OPBRIDGE_KERNEL(group_norm_decl, kCpu, forward);
OPBRIDGE_KERNEL(group_norm_backward_decl, kCpu, backward);

}  // namespace opbridge
