// CPU kernels of myops::rms_norm and their compute functions (see rms_norm.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "rms_norm.h"

namespace myops {
namespace {

using opbridge::KernelCall;
using opbridge::ParallelFor;
using opbridge::Status;

// Rows per task: enough work (~16k elements) to be worth a task of the caller's thread pool.
int64_t grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n)); }

// x, y: [rows, channels], contiguous; weight: [channels].
template <class T>
void forward(const T* x, const T* weight, T* y, const RmsNormParams& p, const ParallelFor& pf) {
  const int64_t C = p.channels;
  pf(p.rows, grain(C), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * C;
      double sum_sq = 0;  // in double: rounding stays far below T's over long rows
      for (int64_t c = 0; c < C; ++c) sum_sq += static_cast<double>(xr[c]) * xr[c];
      const double rstd = 1 / std::sqrt(sum_sq / C + p.eps);
      for (int64_t c = 0; c < C; ++c) y[r * C + c] = static_cast<T>(xr[c] * rstd * weight[c]);
    }
  });
}

// With r = rstd of the row and g = grad * weight: grad_x = r * g - x * r^3 * mean(g * x);
// grad_weight[c] = sum over rows of grad * x * r.
template <class T>
void backward(const T* grad, const T* x, const T* weight, T* grad_x, T* grad_weight, const RmsNormParams& p,
              const ParallelFor& pf) {
  const int64_t C = p.channels;
  std::vector<double> rstd(static_cast<size_t>(p.rows));
  pf(p.rows, grain(C), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * C;
      const T* gr = grad + r * C;
      double sum_sq = 0, sum_gx = 0;
      for (int64_t c = 0; c < C; ++c) {
        sum_sq += static_cast<double>(xr[c]) * xr[c];
        sum_gx += static_cast<double>(gr[c]) * weight[c] * xr[c];
      }
      const double rs = 1 / std::sqrt(sum_sq / C + p.eps), k = rs * rs * rs * sum_gx / C;
      rstd[r] = rs;
      for (int64_t c = 0; c < C; ++c) grad_x[r * C + c] = static_cast<T>(rs * gr[c] * weight[c] - k * xr[c]);
    }
  });
  // Each channel sums over all rows: one task per range of channels, no atomics.
  pf(C, grain(p.rows), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      double sum = 0;  // double: rows may be many
      for (int64_t r = 0; r < p.rows; ++r) sum += static_cast<double>(grad[r * C + c]) * x[r * C + c] * rstd[r];
      grad_weight[c] = static_cast<T>(sum);
    }
  });
}

// The compute functions: the checked call's tensors (contiguous, outputs allocated from the
// declaration's rules) into the kernels, for the element types the declaration allows.
Status forward_cpu(const KernelCall& k) {
  const RmsNormParams p = rms_norm_params(k);
  return opbridge::dispatch<float, double>(k.type("x"), [&](auto tag) {
    using T = decltype(tag);
    forward<T>(k.in<T>("x"), k.in<T>("weight"), k.out<T>(0), p, k.parallel());
    return Status::Ok();
  });
}

Status backward_cpu(const KernelCall& k) {
  const RmsNormParams p = rms_norm_params(k);
  return opbridge::dispatch<float, double>(k.type("x"), [&](auto tag) {
    using T = decltype(tag);
    backward<T>(k.in<T>("grad"), k.in<T>("x"), k.in<T>("weight"), k.out<T>(0), k.out<T>(1), p, k.parallel());
    return Status::Ok();
  });
}

}  // namespace

OPBRIDGE_KERNEL(rms_norm_decl, kCpu, forward_cpu);
OPBRIDGE_KERNEL(rms_norm_backward_decl, kCpu, backward_cpu);

}  // namespace myops
