// ThreeNN CUDA kernel and its compute function: one thread per target point, the CPU kernel's
// scan (explicitly rounded multiplies and adds, the same Top3: the CPU kernel's indices).
#include <cstdint>

#include "common/dtype.cuh"
#include "common/launch.cuh"
#include "common/point_cloud.cuh"
#include "common/rounding.cuh"
#include "three_nn.h"
#include "three_nn_top3.h"

namespace opbridge::cuda {
namespace {

template <class D>
__global__ void three_nn_kernel(const D* __restrict__ target, const D* __restrict__ source, D* __restrict__ dist,
                                int64_t* __restrict__ indices, int64_t total, int64_t n, int64_t m) {
  using C = acc<D>;
  for (int64_t bn = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; bn < total; bn += int64_t{gridDim.x} * blockDim.x) {
    const D* src = source + (bn / n) * m * 3;
    const C tx = to_acc(target[bn * 3]), ty = to_acc(target[bn * 3 + 1]), tz = to_acc(target[bn * 3 + 2]);
    point_cloud::Top3<C> top{C(INFINITY)};
    for (int64_t k = 0; k < m; ++k) {
      const C dx = to_acc(src[3 * k]) - tx, dy = to_acc(src[3 * k + 1]) - ty, dz = to_acc(src[3 * k + 2]) - tz;
      top.offer(squared_distance_rn(dx, dy, dz), k);
    }
    dist[bn * 3] = from_acc<D>(sqrt(top.d0));
    dist[bn * 3 + 1] = from_acc<D>(sqrt(top.d1));
    dist[bn * 3 + 2] = from_acc<D>(sqrt(top.d2));
    indices[bn * 3] = top.i0;
    indices[bn * 3 + 1] = top.i1;
    indices[bn * 3 + 2] = top.i2;
  }
}

Status compute(const KernelCall& k) {
  const ThreeNNParams p = three_nn_params(k);
  const int64_t total = p.B * p.N;
  return dispatch_device(k, "target", [&](auto tag) {
    using D = decltype(tag);
    return launch_elements(three_nn_kernel<D>, total, stream_of(k), k.in<D>("target"), k.in<D>("source"),
                           k.out<D>(0), k.out<int64_t>(1), total, p.N, p.M);
  });
}

}  // namespace
}  // namespace opbridge::cuda

OPBRIDGE_KERNEL(opbridge::three_nn_decl, kCuda, opbridge::cuda::compute);
