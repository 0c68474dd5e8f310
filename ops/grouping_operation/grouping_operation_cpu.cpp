// GroupingOperation / GatherPoints CPU kernels (framework-free) and their compute functions.
// Rows (b, c) run in parallel: each writes its own output row, so the backward's scatter-add
// needs no atomics.
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "grouping_operation.h"
#include "opbridge/dtype.h"
#include "opbridge/point_cloud_op.h"

namespace opbridge {

template <class I>
Status check_gather_indices(const I* indices, const std::vector<int64_t>& shape, int64_t n) {
  int64_t total = 1;
  for (int64_t s : shape) total *= s;
  for (int64_t j = 0; j < total; ++j) {
    const int64_t v = static_cast<int64_t>(indices[j]);
    if (v >= 0 && v < n) continue;
    std::string where;
    int64_t rest = j;
    for (size_t a = shape.size(); a-- > 0;) {
      where = std::to_string(rest % shape[a]) + (where.empty() ? "" : ", ") + where;
      rest /= shape[a];
    }
    return Status::InvalidArgument("indices[" + where + "] = " + std::to_string(v) +
                                   " is outside [0, N = features.shape[2] = " + std::to_string(n) + ")");
  }
  return Status::Ok();
}

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

#define OPBRIDGE_GATHER_INSTANTIATE(T, I)                                                                 \
  template void gather_cpu<T, I>(const T*, const I*, T*, const GatherDims&, const ParallelFor&);          \
  template void gather_backward_cpu<T, I>(const T*, const I*, T*, const GatherDims&, const ParallelFor&);
#define OPBRIDGE_GATHER_INSTANTIATE_I(I)  \
  OPBRIDGE_GATHER_INSTANTIATE(float, I)   \
  OPBRIDGE_GATHER_INSTANTIATE(double, I)  \
  OPBRIDGE_GATHER_INSTANTIATE(Half, I)    \
  OPBRIDGE_GATHER_INSTANTIATE(BFloat16, I)
OPBRIDGE_GATHER_INSTANTIATE_I(int64_t)
OPBRIDGE_GATHER_INSTANTIATE_I(int32_t)
template Status check_gather_indices<int64_t>(const int64_t*, const std::vector<int64_t>&, int64_t);
template Status check_gather_indices<int32_t>(const int32_t*, const std::vector<int64_t>&, int64_t);
#undef OPBRIDGE_GATHER_INSTANTIATE_I
#undef OPBRIDGE_GATHER_INSTANTIATE

namespace {

template <bool kBackward>
Status compute(const KernelCall& k) {
  const GatherDims d = gather_dims(k);
  return point_cloud::dispatch_gather(k, [&](auto itag, auto tag) {
    using I = decltype(itag);
    using T = decltype(tag);
    const I* idx = k.in<I>("indices");
    OPBRIDGE_RETURN_IF_ERROR(check_gather_indices<I>(idx, k.arg("indices").shape, d.N));
    if constexpr (kBackward) {
      gather_backward_cpu<T, I>(k.in<T>("grad_output"), idx, k.out<T>(0), d, k.parallel());
    } else {
      gather_cpu<T, I>(k.in<T>("features"), idx, k.out<T>(0), d, k.parallel());
    }
    return Status::Ok();
  });
}

}  // namespace

OPBRIDGE_KERNEL(grouping_operation_decl, kCpu, compute<false>);
OPBRIDGE_KERNEL(grouping_operation_backward_decl, kCpu, compute<true>);
OPBRIDGE_KERNEL(gather_points_decl, kCpu, compute<false>);
OPBRIDGE_KERNEL(gather_points_backward_decl, kCpu, compute<true>);

}  // namespace opbridge
