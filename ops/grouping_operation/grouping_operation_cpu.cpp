// GroupingOperation / GatherPoints CPU kernels (framework-free) and their compute functions.
// Rows (b, c) run in parallel: each writes its own output row, so the backward's scatter-add
// needs no atomics.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "grouping_operation.h"
#include "opbridge/dtype.h"
#include "opbridge/point_cloud_op.h"

namespace opbridge {

template <class T, class I>
void gather_cpu(const T* features, const I* indices, T* out, const GatherDims& d, const ParallelFor& pf) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.J));
  pf(d.B * d.C, grain, [&](int64_t begin, int64_t end) {
    for (int64_t bc = begin; bc < end; ++bc) {
      const T* f = features + bc * d.N;
      const I* idx = indices + (bc / d.C) * d.J;
      T* o = out + bc * d.J;
      for (int64_t j = 0; j < d.J; ++j) o[j] = f[idx[j]];
    }
  });
}

template <class T, class I>
void gather_backward_cpu(const T* grad_out, const I* indices, T* grad_features, const GatherDims& d,
                         const ParallelFor& pf) {
  using A = acc_t<T>;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.J + d.N));
  pf(d.B * d.C, grain, [&](int64_t begin, int64_t end) {
    std::vector<A> row(std::is_same_v<A, T> ? 0 : d.N);
    for (int64_t bc = begin; bc < end; ++bc) {
      const T* g = grad_out + bc * d.J;
      const I* idx = indices + (bc / d.C) * d.J;
      T* gf = grad_features + bc * d.N;
      if constexpr (std::is_same_v<A, T>) {
        std::fill(gf, gf + d.N, T(0));
        for (int64_t j = 0; j < d.J; ++j) gf[idx[j]] += g[j];
      } else {
        std::fill(row.begin(), row.end(), A(0));
        for (int64_t j = 0; j < d.J; ++j) row[idx[j]] += to_float(g[j]);
        for (int64_t i = 0; i < d.N; ++i) gf[i] = from_acc<T>(row[i]);
      }
    }
  });
}

#define OPBRIDGE_GATHER_INSTANTIATE(T, I)                                                        \
  template void gather_cpu<T, I>(const T*, const I*, T*, const GatherDims&, const ParallelFor&); \
  template void gather_backward_cpu<T, I>(const T*, const I*, T*, const GatherDims&, const ParallelFor&);
OPBRIDGE_FOR_GATHER_TYPES(OPBRIDGE_GATHER_INSTANTIATE)
#undef OPBRIDGE_GATHER_INSTANTIATE

namespace {

Status forward(const KernelCall& k) {
  const GatherDims d = gather_dims(k);
  return point_cloud::dispatch_checked_gather(k, d.N, "N", [&](auto tag, const auto* idx) {
    using T = decltype(tag);
    gather_cpu(k.in<T>("features"), idx, k.out<T>(0), d, k.parallel());
  });
}

Status backward(const KernelCall& k) {
  const GatherDims d = gather_dims(k);
  return point_cloud::dispatch_checked_gather(k, d.N, "N", [&](auto tag, const auto* idx) {
    using T = decltype(tag);
    gather_backward_cpu(k.in<T>("grad_output"), idx, k.out<T>(0), d, k.parallel());
  });
}

}  // namespace

OPBRIDGE_KERNEL(grouping_operation_decl, kCpu, forward);
OPBRIDGE_KERNEL(grouping_operation_backward_decl, kCpu, backward);
OPBRIDGE_KERNEL(gather_points_decl, kCpu, forward);
OPBRIDGE_KERNEL(gather_points_backward_decl, kCpu, backward);

}  // namespace opbridge
