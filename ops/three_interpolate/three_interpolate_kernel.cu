// ThreeInterpolate CUDA kernels and their compute functions: one thread per output element
// (forward; weight's gradient: one per (b, n, j), summing over channels), atomics for features'
// gradient (into a float workspace for the 16-bit types). An index outside [0, M) cannot be
// reported without synchronizing: its feature reads as 0 and its gradient is dropped.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/dtype.cuh"
#include "common/launch.cuh"
#include "common/rounding.cuh"
#include "common/point_cloud.cuh"
#include "opbridge/point_cloud_op.h"
#include "three_interpolate.h"

namespace opbridge::cuda {
namespace {

template <class D, class I>
__device__ __forceinline__ acc<D> feature(const D* f, const I* idx, int64_t j, int64_t m) {
  const int64_t i = static_cast<int64_t>(idx[j]);
  return (i >= 0 && i < m) ? to_acc(f[i]) : acc<D>(0);
}

template <class D, class I>
__global__ void forward_kernel(const D* __restrict__ f, const I* __restrict__ idx, const D* __restrict__ w,
                               D* __restrict__ out, int64_t total, int64_t c, int64_t m, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bc = e / n, nn = e % n, b = bc / c;
    const D* fr = f + bc * m;
    const I* ix = idx + (b * n + nn) * 3;
    const D* wr = w + (b * n + nn) * 3;
    const acc<D> v = add_rn(add_rn(mul_rn(to_acc(wr[0]), feature(fr, ix, 0, m)), mul_rn(to_acc(wr[1]), feature(fr, ix, 1, m))),
                            mul_rn(to_acc(wr[2]), feature(fr, ix, 2, m)));
    out[e] = from_acc<D>(v);
  }
}

template <class D, class A, class I>
__global__ void grad_features_kernel(const D* __restrict__ g, const I* __restrict__ idx, const D* __restrict__ w,
                                     A* __restrict__ gf, int64_t total, int64_t c, int64_t m, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bc = e / n, nn = e % n, b = bc / c;
    const A gv = to_acc(g[e]);
    for (int j = 0; j < 3; ++j) {
      const int64_t i = static_cast<int64_t>(idx[(b * n + nn) * 3 + j]);
      if (i >= 0 && i < m) atomicAdd(gf + bc * m + i, static_cast<A>(to_acc(w[(b * n + nn) * 3 + j])) * gv);
    }
  }
}

template <class D, class I>
__global__ void grad_weight_kernel(const D* __restrict__ g, const D* __restrict__ f, const I* __restrict__ idx,
                                   D* __restrict__ gw, int64_t total, int64_t c, int64_t m, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bn = e / 3, b = bn / n, nn = bn % n;
    acc<D> s = 0;
    for (int64_t cc = 0; cc < c; ++cc) {
      s += to_acc(g[(b * c + cc) * n + nn]) * feature(f + (b * c + cc) * m, idx, e, m);
    }
    gw[e] = from_acc<D>(s);
  }
}

Status forward(const KernelCall& k) {
  const ThreeInterpolateDims d = three_interpolate_dims(k);
  const int64_t total = d.B * d.C * d.N;
  return dispatch_gather_device(k, [&](auto tag, const auto* idx) {
    using D = decltype(tag);
    return launch_elements(forward_kernel<D, std::decay_t<decltype(*idx)>>, total, stream_of(k), k.in<D>("features"),
                           idx, k.in<D>("weight"), k.out<D>(0), total, d.C, d.M, d.N);
  });
}

Status backward(const KernelCall& k) {
  const ThreeInterpolateDims d = three_interpolate_dims(k);
  const int64_t total = d.B * d.C * d.N, w_total = d.B * d.N * 3;
  const Stream stream = stream_of(k);
  return dispatch_gather_device(k, [&](auto tag, const auto* idx) {
    using D = decltype(tag);
    using A = acc<D>;
    using I = std::decay_t<decltype(*idx)>;
    const D *g = k.in<D>("grad_output"), *f = k.in<D>("features"), *w = k.in<D>("weight");
    OPBRIDGE_RETURN_IF_ERROR(scatter_add(k, stream, k.out<D>(0), d.B * d.C * d.M, [&](A* gf) {
      return launch_elements(grad_features_kernel<D, A, I>, total, stream, g, idx, w, gf, total, d.C, d.M, d.N);
    }));
    return launch_elements(grad_weight_kernel<D, I>, w_total, stream, g, f, idx, k.out<D>(1), w_total, d.C, d.M, d.N);
  });
}

}  // namespace
}  // namespace opbridge::cuda

OPBRIDGE_KERNEL(opbridge::three_interpolate_decl, kCuda, opbridge::cuda::forward);
OPBRIDGE_KERNEL(opbridge::three_interpolate_backward_decl, kCuda, opbridge::cuda::backward);
