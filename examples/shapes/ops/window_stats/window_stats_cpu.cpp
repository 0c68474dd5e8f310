// CPU kernels of shapes::window_stats and their compute functions (see window_stats.h).
#include <algorithm>

#include "window_stats.h"

namespace shapes {
namespace {

using opbridge::KernelCall;
using opbridge::ParallelFor;
using opbridge::Status;

// Rows per task: enough work (~16k elements) to be worth a task of the caller's thread pool.
int64_t grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n)); }

// x: [rows, length]; sum, sumsq: [rows, W], W = length / window.
template <class T>
void forward(const T* x, T* sum, T* sumsq, const WindowStatsParams& p, const ParallelFor& pf) {
  const int64_t W = p.length / p.window;
  pf(p.rows, grain(p.length), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t w = 0; w < W; ++w) {
        const T* xw = x + r * p.length + w * p.window;
        double s = 0, q = 0;  // double: windows may be long
        for (int64_t k = 0; k < p.window; ++k) {
          s += xw[k];
          q += static_cast<double>(xw[k]) * xw[k];
        }
        sum[r * W + w] = static_cast<T>(s);
        sumsq[r * W + w] = static_cast<T>(q);
      }
    }
  });
}

// grad_x = grad_sum + 2 x grad_sumsq in each window, 0 in the left-out tail.
template <class T>
void backward(const T* grad_sum, const T* grad_sumsq, const T* x, T* grad_x, const WindowStatsParams& p,
              const ParallelFor& pf) {
  const int64_t W = p.length / p.window;
  pf(p.rows, grain(p.length), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t i = 0; i < p.length; ++i) {
        const int64_t w = i / p.window, o = r * W + w, k = r * p.length + i;
        grad_x[k] = w < W ? static_cast<T>(grad_sum[o] + 2 * x[k] * grad_sumsq[o]) : T(0);
      }
    }
  });
}

// The compute functions: the checked call's tensors (contiguous, outputs allocated from the
// declaration's rules) into the kernels, for the element types the declaration allows.
Status forward_cpu(const KernelCall& k) {
  const WindowStatsParams p = window_stats_params(k);
  return opbridge::dispatch<float, double>(k.type("x"), [&](auto tag) {
    using T = decltype(tag);
    forward<T>(k.in<T>("x"), k.out<T>(0), k.out<T>(1), p, k.parallel());
    return Status::Ok();
  });
}

Status backward_cpu(const KernelCall& k) {
  const WindowStatsParams p = window_stats_params(k);
  return opbridge::dispatch<float, double>(k.type("x"), [&](auto tag) {
    using T = decltype(tag);
    backward<T>(k.in<T>("grad_sum"), k.in<T>("grad_sumsq"), k.in<T>("x"), k.out<T>(0), p, k.parallel());
    return Status::Ok();
  });
}

}  // namespace

OPBRIDGE_KERNEL(window_stats_decl, kCpu, forward_cpu);
OPBRIDGE_KERNEL(window_stats_backward_decl, kCpu, backward_cpu);

}  // namespace shapes
