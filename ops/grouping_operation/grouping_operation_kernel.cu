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

Status forward(const KernelCall& k) {
  const GatherDims d = gather_dims(k);
  const int64_t total = d.B * d.C * d.J;
  return dispatch_gather_device(k, [&](auto tag, const auto* idx) {
    using D = decltype(tag);
    return launch_elements(gather_kernel<D, std::decay_t<decltype(*idx)>>, total, stream_of(k), k.in<D>("features"),
                           idx, k.out<D>(0), total, d.C, d.N, d.J);
  });
}

Status backward(const KernelCall& k) {
  const GatherDims d = gather_dims(k);
  const int64_t total = d.B * d.C * d.J;
  const Stream stream = stream_of(k);
  return dispatch_gather_device(k, [&](auto tag, const auto* idx) {
    using D = decltype(tag);
    using A = acc<D>;
    const D* g = k.in<D>("grad_output");
    return scatter_add(k, stream, k.out<D>(0), d.B * d.C * d.N, [&](A* gf) {
      return launch_elements(scatter_kernel<D, A, std::decay_t<decltype(*idx)>>, total, stream, g, idx, gf, total, d.C,
                             d.N, d.J);
    });
  });
}

}  // namespace
}  // namespace opbridge::cuda

OPBRIDGE_KERNEL(opbridge::grouping_operation_decl, kCuda, opbridge::cuda::forward);
OPBRIDGE_KERNEL(opbridge::grouping_operation_backward_decl, kCuda, opbridge::cuda::backward);
OPBRIDGE_KERNEL(opbridge::gather_points_decl, kCuda, opbridge::cuda::forward);
OPBRIDGE_KERNEL(opbridge::gather_points_backward_decl, kCuda, opbridge::cuda::backward);
