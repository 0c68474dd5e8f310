// ThreeInterpolate CPU kernels (framework-free) and their compute functions. The forward and
// the features' gradient run over rows (b, c), so that the gradient's scatter-add into a row
// needs no atomics; the weight's gradient runs over points (b, n), reading a column of each.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "opbridge/dtype.h"
#include "opbridge/point_cloud.h"
#include "opbridge/point_cloud_op.h"
#include "three_interpolate.h"

OPBRIDGE_NO_FP_CONTRACT_BEGIN
namespace opbridge {

template <class T, class I>
void three_interpolate_cpu(const T* features, const I* indices, const T* weight, T* out, const ThreeInterpolateDims& d,
                           const ParallelFor& pf) {
  using A = acc_t<T>;
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, d.N));
  pf(d.B * d.C, grain, [&](int64_t begin, int64_t end) {
    for (int64_t bc = begin; bc < end; ++bc) {
      const int64_t b = bc / d.C;
      const T* f = features + bc * d.M;
      const I* idx = indices + b * d.N * 3;
      const T* w = weight + b * d.N * 3;
      T* o = out + bc * d.N;
      for (int64_t n = 0; n < d.N; ++n) {
        const A v = (A(to_float(w[3 * n])) * A(to_float(f[idx[3 * n]])) +
                     A(to_float(w[3 * n + 1])) * A(to_float(f[idx[3 * n + 1]]))) +
                    A(to_float(w[3 * n + 2])) * A(to_float(f[idx[3 * n + 2]]));
        o[n] = from_acc<T>(v);
      }
    }
  });
}

template <class T, class I>
void three_interpolate_backward_cpu(const T* grad_out, const T* features, const I* indices, const T* weight,
                                    T* grad_features, T* grad_weight, const ThreeInterpolateDims& d,
                                    const ParallelFor& pf) {
  using A = acc_t<T>;
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, d.N + d.M));
  pf(d.B * d.C, grain, [&](int64_t begin, int64_t end) {
    std::vector<A> row(d.M);
    for (int64_t bc = begin; bc < end; ++bc) {
      const int64_t b = bc / d.C;
      const T* g = grad_out + bc * d.N;
      const I* idx = indices + b * d.N * 3;
      const T* w = weight + b * d.N * 3;
      std::fill(row.begin(), row.end(), A(0));
      for (int64_t n = 0; n < d.N; ++n) {
        const A gn = to_float(g[n]);
        for (int j = 0; j < 3; ++j) row[idx[3 * n + j]] += A(to_float(w[3 * n + j])) * gn;
      }
      T* gf = grad_features + bc * d.M;
      for (int64_t m = 0; m < d.M; ++m) gf[m] = from_acc<T>(row[m]);
    }
  });
  const int64_t grain_w = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, d.C));
  pf(d.B * d.N, grain_w, [&](int64_t begin, int64_t end) {
    for (int64_t bn = begin; bn < end; ++bn) {
      const int64_t b = bn / d.N, n = bn % d.N;
      const I* idx = indices + bn * 3;
      A acc[3] = {0, 0, 0};
      for (int64_t c = 0; c < d.C; ++c) {
        const A gn = to_float(grad_out[(b * d.C + c) * d.N + n]);
        const T* f = features + (b * d.C + c) * d.M;
        for (int j = 0; j < 3; ++j) acc[j] += gn * A(to_float(f[idx[j]]));
      }
      for (int j = 0; j < 3; ++j) grad_weight[bn * 3 + j] = from_acc<T>(acc[j]);
    }
  });
}

#define OPBRIDGE_TI_INSTANTIATE(T, I)                                                                             \
  template void three_interpolate_cpu<T, I>(const T*, const I*, const T*, T*, const ThreeInterpolateDims&,        \
                                            const ParallelFor&);                                                  \
  template void three_interpolate_backward_cpu<T, I>(const T*, const T*, const I*, const T*, T*, T*,              \
                                                     const ThreeInterpolateDims&, const ParallelFor&);
OPBRIDGE_FOR_GATHER_TYPES(OPBRIDGE_TI_INSTANTIATE)
#undef OPBRIDGE_TI_INSTANTIATE

namespace {

Status forward(const KernelCall& k) {
  const ThreeInterpolateDims d = three_interpolate_dims(k);
  return point_cloud::dispatch_checked_gather(k, d.M, "M", [&](auto tag, const auto* idx) {
    using T = decltype(tag);
    three_interpolate_cpu(k.in<T>("features"), idx, k.in<T>("weight"), k.out<T>(0), d, k.parallel());
  });
}

Status backward(const KernelCall& k) {
  const ThreeInterpolateDims d = three_interpolate_dims(k);
  return point_cloud::dispatch_checked_gather(k, d.M, "M", [&](auto tag, const auto* idx) {
    using T = decltype(tag);
    three_interpolate_backward_cpu(k.in<T>("grad_output"), k.in<T>("features"), idx, k.in<T>("weight"), k.out<T>(0),
                                   k.out<T>(1), d, k.parallel());
  });
}

}  // namespace

OPBRIDGE_KERNEL(three_interpolate_decl, kCpu, forward);
OPBRIDGE_KERNEL(three_interpolate_backward_decl, kCpu, backward);

}  // namespace opbridge
OPBRIDGE_NO_FP_CONTRACT_END
