// CPU kernels of shapes::window_stats (see window_stats.h): framework-free, shared by the torch and ORT ops.
#include <algorithm>
#include <vector>

#include "window_stats.h"

namespace shapes {

template <class T>
opbridge::Status window_stats_cpu(const T* x, T* sum, T* sumsq, const WindowStatsDims& d,
                                  const opbridge::ParallelFor& pf) {
  const int64_t W = d.length / d.window;
  pf(d.rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.length)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t w = 0; w < W; ++w) {
        const T* xw = x + r * d.length + w * d.window;
        double s = 0, q = 0;
        for (int64_t k = 0; k < d.window; ++k) s += xw[k], q += double(xw[k]) * xw[k];
        sum[r * W + w] = static_cast<T>(s), sumsq[r * W + w] = static_cast<T>(q);
      }
    }
  });
  return opbridge::Status::Ok();
}

template <class T>
opbridge::Status window_stats_backward_cpu(const T* grad_sum, const T* grad_sumsq, const T* x, T* grad_x,
                                           const WindowStatsDims& d, const opbridge::ParallelFor& pf) {
  const int64_t W = d.length / d.window;
  pf(d.rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.length)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t i = 0; i < d.length; ++i) {
        const int64_t w = i / d.window, o = r * W + w, k = r * d.length + i;
        grad_x[k] = w < W ? static_cast<T>(grad_sum[o] + 2 * x[k] * grad_sumsq[o]) : T(0);
      }
    }
  });
  return opbridge::Status::Ok();
}

// The element types the declaration allows (kFloat32And64).
#define SHAPES_WINDOW_STATS_INSTANTIATE(T)                                                                          \
  template opbridge::Status window_stats_cpu<T>(const T*, T*, T*, const WindowStatsDims&,                    \
                                                const opbridge::ParallelFor&);                                  \
  template opbridge::Status window_stats_backward_cpu<T>(const T*, const T*, const T*, T*,                      \
                                                         const WindowStatsDims&, const opbridge::ParallelFor&);
SHAPES_WINDOW_STATS_INSTANTIATE(float)
SHAPES_WINDOW_STATS_INSTANTIATE(double)

}  // namespace shapes
