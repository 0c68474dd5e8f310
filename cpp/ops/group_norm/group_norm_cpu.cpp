// GroupNorm CPU kernels: framework-free, shared by the torch op, the ORT op and opbridge._core.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "common/simd_generic.h"
#include "group_norm_isa.h"
#include "group_norm_simd.h"
#include "opbridge/cpu_isa.h"
#include "opbridge/dtype.h"
#include "opbridge/group_norm.h"

namespace opbridge {

namespace {

// Elements summed in independent lanes before folding into a double. 16 lanes let the compiler
// keep several SIMD accumulators busy; a block of 2048 keeps each float partial sum short
// enough (<= 128 terms per lane) that its rounding error stays far below float epsilon * |sum|.
constexpr int kLanes = 16;
constexpr int64_t kBlock = 2048;

// sum(x[i] - shift) over n elements, accumulated in blocks of lanes, folded in double.
template <class T>
double shifted_sum(const T* x, int64_t n, acc_t<T> shift) {
  using A = acc_t<T>;
  double total = 0.0;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    A lanes[kLanes] = {};
    int64_t i = b0;
    for (; i + kLanes <= b1; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) lanes[l] += to_float(x[i + l]) - shift;
    }
    for (; i < b1; ++i) lanes[0] += to_float(x[i]) - shift;
    double s = 0.0;
    for (int l = 0; l < kLanes; ++l) s += static_cast<double>(lanes[l]);
    total += s;
  }
  return total;
}

// sum((x[i] - m)^2) over n elements, same blocking as shifted_sum.
template <class T>
double sum_sq_dev(const T* x, int64_t n, acc_t<T> m) {
  using A = acc_t<T>;
  double total = 0.0;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    A lanes[kLanes] = {};
    int64_t i = b0;
    for (; i + kLanes <= b1; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        const A d = to_float(x[i + l]) - m;
        lanes[l] += d * d;
      }
    }
    for (; i < b1; ++i) {
      const A d = to_float(x[i]) - m;
      lanes[0] += d * d;
    }
    double s = 0.0;
    for (int l = 0; l < kLanes; ++l) s += static_cast<double>(lanes[l]);
    total += s;
  }
  return total;
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

// Rows of at most this many elements are too small to be worth a parallel task on their own.
constexpr int64_t kMinTaskElems = 1 << 14;

int64_t grain_for(int64_t elems_per_item) {
  return std::max<int64_t>(1, kMinTaskElems / std::max<int64_t>(1, elems_per_item));
}

}  // namespace

namespace group_norm_isa {
template <class T>
void forward_baseline(const Args<T>& a, const ParallelFor& pf) {
  gn_forward<SimdGeneric, T>(a, pf);
}
}  // namespace group_norm_isa

namespace {

// float64 keeps the straightforward kernel: two passes over each group in double.
Status group_norm_cpu_f64(const double* x, const double* weight, const double* bias, double* y, int64_t N,
                          int64_t C, int64_t S, int64_t num_groups, double eps, double* mean, double* rstd,
                          const ParallelFor& pf) {
  const int64_t G = num_groups;
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
  const int64_t group_elems = Cg * S;
  pf(N * G, grain_for(group_elems), [&](int64_t begin, int64_t end) {
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
        // y = (x - m) * a + b: folding m into the offset (x * a + (b - m * a)) would save a
        // subtraction but cancel catastrophically when a = rstd * w is large (variance << eps).
        const double a = r * (weight != nullptr ? weight[c] : 1.0);
        const double b = bias != nullptr ? bias[c] : 0.0;
        const double* xc = xg + ci * S;
        double* yc = yg + ci * S;
        for (int64_t i = 0; i < S; ++i) yc[i] = (xc[i] - m) * a + b;
      }
    }
  });
  return Status::Ok();
}

}  // namespace

template <class T>
Status group_norm_cpu(const T* x, const T* weight, const T* bias, T* y, int64_t N, int64_t C,
                      int64_t S, int64_t num_groups, double eps, acc_t<T>* mean, acc_t<T>* rstd,
                      const ParallelFor& pf, CpuIsa isa) {
  if (!cpu_isa_supported(isa)) {
    return Status::NotImplemented(std::string("the ") + cpu_isa_name(isa) +
                                  " kernels are not available on this CPU or in this build");
  }
  if constexpr (std::is_same_v<T, double>) {
    return group_norm_cpu_f64(x, weight, bias, y, N, C, S, num_groups, eps, mean, rstd, pf);
  } else {
    const group_norm_isa::Args<T> a{x, weight, bias, y, N, C, S, num_groups, eps, mean, rstd};
    switch (cpu_isa_resolve(isa)) {
#if defined(OPBRIDGE_X86_DISPATCH)
      case CpuIsa::kAvx512: group_norm_isa::forward_avx512(a, pf); break;
      case CpuIsa::kAvx2: group_norm_isa::forward_avx2(a, pf); break;
#endif
      default: group_norm_isa::forward_baseline(a, pf); break;
    }
    return Status::Ok();
  }
}

template <class T>
Status group_norm_backward_cpu(const T* dy, const T* x, const T* weight, T* dx, T* dweight,
                               T* dbias, int64_t N, int64_t C, int64_t S, int64_t num_groups,
                               double eps, const ParallelFor& pf) {
  using A = acc_t<T>;
  const int64_t G = num_groups;
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
  const int64_t group_elems = Cg * S;
  // Per (n, c): sum(dy * (x - mean)) and sum(dy); per (n, g): rstd. Reduced over n below.
  std::vector<double> ds(static_cast<size_t>(N * C)), db(static_cast<size_t>(N * C));
  std::vector<double> rstds(static_cast<size_t>(N * G));
  pf(N * G, grain_for(group_elems), [&](int64_t begin, int64_t end) {
    for (int64_t ng = begin; ng < end; ++ng) {
      const int64_t n = ng / G, g = ng % G;
      const T* xg = x + ng * group_elems;
      const T* dyg = dy + ng * group_elems;
      double m = 0.0, r = 0.0;
      group_stats(xg, group_elems, eps, &m, &r);
      rstds[ng] = r;
      // sum over the group of dxhat and dxhat * xhat, where dxhat = dy * w. x - m is taken
      // against the mean as m_hi + m_lo, as in the forward pass (no cancellation at large offsets).
      double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
      A m_hi;
      double m_lo;
      split_mean(m, &m_hi, &m_lo);
      for (int64_t ci = 0; ci < Cg; ++ci) {
        const int64_t c = g * Cg + ci;
        const T* xc = xg + ci * S;
        const T* dyc = dyg + ci * S;
        A l_ds[kLanes] = {}, l_db[kLanes] = {};
        double s_ds = 0.0, s_db = 0.0;
        for (int64_t b0 = 0; b0 < S; b0 += kBlock) {
          const int64_t b1 = std::min(S, b0 + kBlock);
          int64_t i = b0;
          for (; i + kLanes <= b1; i += kLanes) {
            for (int l = 0; l < kLanes; ++l) {
              const A d = to_float(dyc[i + l]);
              l_ds[l] += d * (to_float(xc[i + l]) - m_hi);
              l_db[l] += d;
            }
          }
          for (; i < b1; ++i) {
            const A d = to_float(dyc[i]);
            l_ds[0] += d * (to_float(xc[i]) - m_hi);
            l_db[0] += d;
          }
          for (int l = 0; l < kLanes; ++l) {
            s_ds += static_cast<double>(l_ds[l]);
            s_db += static_cast<double>(l_db[l]);
            l_ds[l] = A(0);
            l_db[l] = A(0);
          }
        }
        // sum(dy * (x - m)) = sum(dy * (x - m_hi)) - m_lo * sum(dy)
        s_ds -= m_lo * s_db;
        ds[n * C + c] = s_ds;
        db[n * C + c] = s_db;
        const double w = weight != nullptr ? static_cast<double>(to_float(weight[c])) : 1.0;
        sum_dxhat += w * s_db;
        sum_dxhat_xhat += w * s_ds * r;
      }
      if (dx == nullptr) continue;
      // dx = r * (w * dy - sum_dxhat / M - xhat * sum_dxhat_xhat / M), xhat = (x - m) * r.
      const double inv_m = 1.0 / static_cast<double>(group_elems);
      const double c2d = -r * r * sum_dxhat_xhat * inv_m;
      const A c2 = static_cast<A>(c2d);
      // x - m = (x - m_hi) - m_lo: the m_lo part folds into the constant term.
      const A c3 = static_cast<A>(-r * sum_dxhat * inv_m - static_cast<double>(c2) * m_lo);
      T* dxg = dx + ng * group_elems;
      for (int64_t ci = 0; ci < Cg; ++ci) {
        const int64_t c = g * Cg + ci;
        const double w = weight != nullptr ? static_cast<double>(to_float(weight[c])) : 1.0;
        const A c1 = static_cast<A>(r * w);
        const T* xc = xg + ci * S;
        const T* dyc = dyg + ci * S;
        T* dxc = dxg + ci * S;
        for (int64_t i = 0; i < S; ++i) {
          dxc[i] = from_acc<T>(c1 * to_float(dyc[i]) + c2 * (to_float(xc[i]) - m_hi) + c3);
        }
      }
    }
  });
  if (dweight != nullptr || dbias != nullptr) {
    for (int64_t c = 0; c < C; ++c) {
      double sw = 0.0, sb = 0.0;
      for (int64_t n = 0; n < N; ++n) {
        sw += ds[n * C + c] * rstds[n * G + c / Cg];
        sb += db[n * C + c];
      }
      if (dweight != nullptr) dweight[c] = from_acc<T>(static_cast<A>(sw));
      if (dbias != nullptr) dbias[c] = from_acc<T>(static_cast<A>(sb));
    }
  }
  return Status::Ok();
}

#define OPBRIDGE_INSTANTIATE_GROUP_NORM(T)                                                          \
  template Status group_norm_cpu<T>(const T*, const T*, const T*, T*, int64_t, int64_t,   \
                                              int64_t, int64_t, double, acc_t<T>*, acc_t<T>*,       \
                                              const ParallelFor&, CpuIsa);                          \
  template Status group_norm_backward_cpu<T>(const T*, const T*, const T*, T*, T*, T*, int64_t,     \
                                             int64_t, int64_t, int64_t, double, const ParallelFor&);

OPBRIDGE_INSTANTIATE_GROUP_NORM(float)
OPBRIDGE_INSTANTIATE_GROUP_NORM(double)
OPBRIDGE_INSTANTIATE_GROUP_NORM(Half)
OPBRIDGE_INSTANTIATE_GROUP_NORM(BFloat16)

}  // namespace opbridge
