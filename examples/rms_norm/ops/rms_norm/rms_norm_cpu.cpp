// CPU kernels of myops::rms_norm (see rms_norm.h): framework-free, shared by the torch and ORT ops.
#include <algorithm>
#include <cmath>
#include <vector>

#include "rms_norm.h"

namespace myops {
namespace {

// Rows per task: enough work (~16k elements) to be worth a task of the caller's thread pool.
int64_t grain(int64_t channels) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, channels)); }

}  // namespace

template <class T>
opbridge::Status rms_norm_cpu(const T* x, const T* weight, T* y, const RmsNormDims& d, double eps,
                          const opbridge::ParallelFor& pf) {
  const int64_t C = d.channels;
  pf(d.rows, grain(C), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * C;
      T* yr = y + r * C;
      double sum_sq = 0;  // in double: rounding stays far below T's over long rows
      for (int64_t c = 0; c < C; ++c) sum_sq += static_cast<double>(xr[c]) * xr[c];
      const double rstd = 1 / std::sqrt(sum_sq / C + eps);
      for (int64_t c = 0; c < C; ++c) yr[c] = static_cast<T>(xr[c] * rstd * weight[c]);
    }
  });
  return opbridge::Status::Ok();
}

template <class T>
opbridge::Status rms_norm_backward_cpu(const T* grad, const T* x, const T* weight, T* grad_x, T* grad_weight,
                                   const RmsNormDims& d, double eps, const opbridge::ParallelFor& pf) {
  const int64_t C = d.channels;
  std::vector<double> rstd(static_cast<size_t>(d.rows));
  // With r = rstd of the row and g = grad * weight: grad_x = r * g - x * r^3 * mean(g * x).
  pf(d.rows, grain(C), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * C;
      const T* gr = grad + r * C;
      double sum_sq = 0, sum_gx = 0;
      for (int64_t c = 0; c < C; ++c) {
        sum_sq += static_cast<double>(xr[c]) * xr[c];
        sum_gx += static_cast<double>(gr[c]) * weight[c] * xr[c];
      }
      const double rs = 1 / std::sqrt(sum_sq / C + eps), k = rs * rs * rs * sum_gx / C;
      rstd[r] = rs;
      for (int64_t c = 0; c < C; ++c) grad_x[r * C + c] = static_cast<T>(rs * gr[c] * weight[c] - k * xr[c]);
    }
  });
  // Each channel sums over all rows: one task per range of channels, no atomics.
  pf(C, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.rows)), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      double sum = 0;  // double: rows may be many
      for (int64_t r = 0; r < d.rows; ++r) sum += static_cast<double>(grad[r * C + c]) * x[r * C + c] * rstd[r];
      grad_weight[c] = static_cast<T>(sum);
    }
  });
  return opbridge::Status::Ok();
}

// The element types the declaration allows (kFloat32And64).
#define MYOPS_RMS_NORM_INSTANTIATE(T)                                                                          \
  template opbridge::Status rms_norm_cpu<T>(const T*, const T*, T*, const RmsNormDims&, double,                  \
                                        const opbridge::ParallelFor&);                                    \
  template opbridge::Status rms_norm_backward_cpu<T>(const T*, const T*, const T*, T*, T*, const RmsNormDims&,   \
                                                 double, const opbridge::ParallelFor&);
MYOPS_RMS_NORM_INSTANTIATE(float)
MYOPS_RMS_NORM_INSTANTIATE(double)

}  // namespace myops
