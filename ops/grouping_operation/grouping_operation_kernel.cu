// GroupingOperation / GatherPoints CUDA kernels and their compute functions: one thread per output
// element. An index outside [0, N) cannot be reported without synchronizing: it reads as 0 and
// its gradient is dropped. The backward adds with atomics, into a float workspace for the
// 16-bit types (converted once at the end).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/dtype.cuh"
#include "common/launch.cuh"
#include "common/point_cloud.cuh"
#include "grouping_operation.h"
#include "opbridge/point_cloud_op.h"

namespace opbridge::cuda {
namespace {

template <class D, class I>
__global__ void gather_kernel(const D* __restrict__ f, const I* __restrict__ idx, D* __restrict__ out, int64_t total,
                              int64_t c, int64_t n, int64_t j) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bc = e / j, jj = e % j;
    const int64_t i = static_cast<int64_t>(idx[(bc / c) * j + jj]);
    out[e] = (i >= 0 && i < n) ? f[bc * n + i] : from_acc<D>(acc<D>(0));
  }
}

template <class D, class A, class I>
__global__ void scatter_kernel(const D* __restrict__ g, const I* __restrict__ idx, A* __restrict__ gf, int64_t total,
                               int64_t c, int64_t n, int64_t j) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bc = e / j, jj = e % j;
    const int64_t i = static_cast<int64_t>(idx[(bc / c) * j + jj]);
    if (i >= 0 && i < n) atomicAdd(gf + bc * n + i, static_cast<A>(to_acc(g[e])));
  }
}

template <bool kBackward>
Status compute(const KernelCall& k) {
  const GatherDims d = gather_dims(k);
  const Stream stream = stream_of(k);
  return point_cloud::dispatch_gather(k, [&](auto itag, auto tag) -> Status {
    using I = decltype(itag);
    using T = decltype(tag);
    using D = typename DeviceType<T>::type;
    using A = acc<D>;
    const I* idx = k.in<I>("indices");
    const int64_t out_total = d.B * d.C * d.J;
    if constexpr (!kBackward) {
      return launch_elements(gather_kernel<D, I>, out_total, stream, reinterpret_cast<const D*>(k.in<T>("features")),
                             idx, reinterpret_cast<D*>(k.out<T>(0)), out_total, d.C, d.N, d.J);
    } else {
      const D* g = reinterpret_cast<const D*>(k.in<T>("grad_output"));
      return scatter_add(k, stream, reinterpret_cast<D*>(k.out<T>(0)), d.B * d.C * d.N, [&](A* gf) {
        return launch_elements(scatter_kernel<D, A, I>, out_total, stream, g, idx, gf, out_total, d.C, d.N, d.J);
      });
    }
  });
}

}  // namespace
}  // namespace opbridge::cuda

OPBRIDGE_KERNEL(opbridge::grouping_operation_decl, kCuda, opbridge::cuda::compute<false>);
OPBRIDGE_KERNEL(opbridge::grouping_operation_backward_decl, kCuda, opbridge::cuda::compute<true>);
OPBRIDGE_KERNEL(opbridge::gather_points_decl, kCuda, opbridge::cuda::compute<false>);
OPBRIDGE_KERNEL(opbridge::gather_points_backward_decl, kCuda, opbridge::cuda::compute<true>);
