// BallQuery CUDA kernel and its compute function: one thread per center, the CPU kernel's loop
// (explicitly rounded multiplies and adds, so the same points fall in the ball).
#include <cstdint>

#include "ball_query.h"
#include "common/dtype.cuh"
#include "common/launch.cuh"
#include "common/point_cloud.cuh"
#include "common/rounding.cuh"

namespace opbridge::cuda {
namespace {

template <class D>
__global__ void ball_query_kernel(const D* __restrict__ xyz, const D* __restrict__ centers, int64_t* __restrict__ out,
                                  int64_t total, int64_t n, int64_t m, int64_t s, acc<D> lo2, acc<D> hi2) {
  using C = acc<D>;
  for (int64_t bm = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; bm < total; bm += int64_t{gridDim.x} * blockDim.x) {
    const D* pts = xyz + (bm / m) * n * 3;
    const C cx = to_acc(centers[bm * 3]), cy = to_acc(centers[bm * 3 + 1]), cz = to_acc(centers[bm * 3 + 2]);
    int64_t* o = out + bm * s;
    int64_t count = 0;
    for (int64_t k = 0; k < n && count < s; ++k) {
      const C dx = to_acc(pts[3 * k]) - cx, dy = to_acc(pts[3 * k + 1]) - cy, dz = to_acc(pts[3 * k + 2]) - cz;
      const C d2 = squared_distance_rn(dx, dy, dz);
      if (d2 == 0 || (d2 >= lo2 && d2 < hi2)) {
        if (count == 0) {
          for (int64_t l = 0; l < s; ++l) o[l] = k;
        }
        o[count++] = k;
      }
    }
    if (count == 0) {
      for (int64_t l = 0; l < s; ++l) o[l] = 0;
    }
  }
}

Status compute(const KernelCall& k) {
  const BallQueryParams p = ball_query_params(k);
  const int64_t total = p.B * p.M;
  return dispatch_device(k, "xyz", [&](auto tag) {
    using D = decltype(tag);
    const acc<D> lo = p.min_radius, hi = p.max_radius;
    return launch_elements(ball_query_kernel<D>, total, stream_of(k), k.in<D>("xyz"), k.in<D>("center_xyz"),
                           k.out<int64_t>(0), total, p.N, p.M, p.S, lo * lo, hi * hi);
  });
}

}  // namespace
}  // namespace opbridge::cuda

OPBRIDGE_KERNEL(opbridge::ball_query_decl, kCuda, opbridge::cuda::compute);
