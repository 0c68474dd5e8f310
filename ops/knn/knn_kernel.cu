// KNN CUDA kernel and its compute function: one thread per center, the CPU kernel's insertion
// into a sorted list (its distances in device scratch, its indices written straight into the
// output's column), with explicitly rounded multiplies and adds: the CPU kernel's indices.
#include <cstdint>

#include "common/dtype.cuh"
#include "common/launch.cuh"
#include "common/point_cloud.cuh"
#include "common/rounding.cuh"
#include "knn.h"

namespace opbridge::cuda {
namespace {

template <class D>
__global__ void knn_kernel(const D* __restrict__ xyz, const D* __restrict__ centers, int64_t* __restrict__ out,
                           acc<D>* __restrict__ dist, int64_t total, int64_t n, int64_t m, int64_t kk) {
  using C = acc<D>;
  for (int64_t bm = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; bm < total; bm += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = bm / m, c = bm % m;
    const D* pts = xyz + b * n * 3;
    const C cx = to_acc(centers[bm * 3]), cy = to_acc(centers[bm * 3 + 1]), cz = to_acc(centers[bm * 3 + 2]);
    C* bd = dist + bm * kk;
    int64_t* bi = out + b * kk * m + c;  // column c of [k, M]: stride m
    int64_t filled = 0;
    for (int64_t i = 0; i < n; ++i) {
      const C dx = to_acc(pts[3 * i]) - cx, dy = to_acc(pts[3 * i + 1]) - cy, dz = to_acc(pts[3 * i + 2]) - cz;
      C d = squared_distance_rn(dx, dy, dz);
      if (d != d) d = C(INFINITY);
      if (filled == kk && !(d < bd[kk - 1])) continue;
      int64_t at = filled < kk ? filled++ : kk - 1;
      while (at > 0 && d < bd[at - 1]) {
        bd[at] = bd[at - 1];
        bi[at * m] = bi[(at - 1) * m];
        --at;
      }
      bd[at] = d;
      bi[at * m] = i;
    }
  }
}

Status compute(const KernelCall& k) {
  const KnnParams p = knn_params(k);
  const int64_t total = p.B * p.M;
  if (total == 0) return Status::Ok();
  return dispatch_device(k, "xyz", [&](auto tag) {
    using D = decltype(tag);
    auto* dist = static_cast<acc<D>*>(k.scratch(sizeof(acc<D>) * static_cast<size_t>(total * p.K)));
    return launch_elements<128>(knn_kernel<D>, total, stream_of(k), k.in<D>("xyz"), k.in<D>("center_xyz"),
                                k.out<int64_t>(0), dist, total, p.N, p.M, p.K);
  });
}

}  // namespace
}  // namespace opbridge::cuda

OPBRIDGE_KERNEL(opbridge::knn_decl, kCuda, opbridge::cuda::compute);
