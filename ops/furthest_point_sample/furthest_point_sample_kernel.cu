// FurthestPointSample CUDA kernel and its compute function: one block per cloud. Each step, every
// thread updates the running distances of its points (kept in device scratch) and the block
// reduces (distance, index) pairs, larger distance first, then lower index: the CPU kernel's
// result. Squared distances use explicitly rounded multiplies and adds, so nvcc cannot fuse them
// into multiply-adds that round differently from the CPU's.
#include <cstdint>

#include "common/dtype.cuh"
#include "common/launch.cuh"
#include "common/point_cloud.cuh"
#include "common/rounding.cuh"
#include "furthest_point_sample.h"

namespace opbridge::cuda {
namespace {

constexpr int kThreads = 512;

template <class D>
__global__ void fps_kernel(const D* __restrict__ points, int64_t* __restrict__ out, acc<D>* __restrict__ dist,
                           int64_t n, int64_t m) {
  using C = acc<D>;
  OPBRIDGE_SHARED_ARRAY(C, best_v, kThreads);
  OPBRIDGE_SHARED_ARRAY(int64_t, best_i, kThreads);
  const int64_t b = blockIdx.x;
  const D* p = points + b * n * 3;
  C* d = dist + b * n;
  int64_t* o = out + b * m;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) d[k] = C(INFINITY);
  if (threadIdx.x == 0) o[0] = 0;
  int64_t last = 0;
  for (int64_t j = 1; j < m; ++j) {
    const C px = to_acc(p[3 * last]), py = to_acc(p[3 * last + 1]), pz = to_acc(p[3 * last + 2]);
    C bv = C(-1);
    int64_t bi = 0;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      const C dx = to_acc(p[3 * k]) - px, dy = to_acc(p[3 * k + 1]) - py, dz = to_acc(p[3 * k + 2]) - pz;
      const C v = squared_distance_rn(dx, dy, dz);
      const C t = v < d[k] ? v : d[k];  // a NaN distance never replaces: it counts as +inf
      d[k] = t;
      if (t > bv) bv = t, bi = k;  // k ascends within a thread: ties keep the lower index
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) {
        const C ov = best_v[threadIdx.x + s];
        const int64_t oi = best_i[threadIdx.x + s];
        if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
          best_v[threadIdx.x] = ov;
          best_i[threadIdx.x] = oi;
        }
      }
      __syncthreads();
    }
    last = best_i[0];
    if (threadIdx.x == 0) o[j] = last;
    __syncthreads();  // best_* are rewritten by the next step
  }
}

Status compute(const KernelCall& k) {
  const FurthestPointSampleParams p = furthest_point_sample_params(k);
  if (p.B == 0 || p.M == 0) return Status::Ok();
  return dispatch_device(k, "points_xyz", [&](auto tag) {
    using D = decltype(tag);
    auto* dist = static_cast<acc<D>*>(k.scratch(sizeof(acc<D>) * static_cast<size_t>(p.B * p.N)));
    LaunchShape shape{dim3(static_cast<unsigned>(p.B)), dim3(kThreads)};
    return cuda_status(launch(fps_kernel<D>, shape, stream_of(k), k.in<D>("points_xyz"), k.out<int64_t>(0), dist, p.N,
                              p.M));
  });
}

}  // namespace
}  // namespace opbridge::cuda

OPBRIDGE_KERNEL(opbridge::furthest_point_sample_decl, kCuda, opbridge::cuda::compute);
