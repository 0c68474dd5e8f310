// opbridge CUDA: what the point-cloud ops' kernels share (nvcc only): grid-stride launches of one
// thread per element or query point, and gradients scattered with atomics (grouping_operation,
// three_interpolate).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/dtype.cuh"
#include "common/launch.cuh"
#include "opbridge/kernel.h"
#include "opbridge/point_cloud_op.h"

namespace opbridge::cuda {

// Threads per block of an element-wise grid-stride kernel; at most 65535 blocks (the loop covers
// the rest), which fills every SM of today's GPUs many times over.
inline constexpr int kElementThreads = 256;

inline LaunchShape element_shape(int64_t total, int threads = kElementThreads) {
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(ceil_div(total, threads), 65535));
  return LaunchShape{dim3(static_cast<unsigned>(blocks)), dim3(static_cast<unsigned>(threads))};
}

// The stream a compute function was handed (ORT's compute stream, torch's current stream).
inline Stream stream_of(const KernelCall& k) { return Stream(static_cast<cudaStream_t>(k.stream())); }

// fn(D{}) for the device type D (float, double, __half, __nv_bfloat16) of input `name`'s element
// type: the dispatch of the point-cloud kernels, which read their tensors as D (k.in<D>, k.out<D>).
template <class F>
Status dispatch_device(const KernelCall& k, const char* name, F&& fn) {
  return dispatch<float, double, Half, BFloat16>(k.type(name), [&](auto tag) -> Status {
    return fn(typename DeviceType<decltype(tag)>::type{});
  });
}

// point_cloud::dispatch_gather with the features' device type: fn(D{}, indices).
template <class F>
Status dispatch_gather_device(const KernelCall& k, F&& fn) {
  return point_cloud::dispatch_gather(k, [&](auto tag, const auto* indices) -> Status {
    return fn(typename DeviceType<decltype(tag)>::type{}, indices);
  });
}

// kernel over `total` elements with a grid-stride loop, kThreads per block; nothing for none.
template <int kThreads = kElementThreads, class... Params, class... Args>
Status launch_elements(void (*kernel)(Params...), int64_t total, Stream stream, Args&&... args) {
  if (total == 0) return Status::Ok();
  return cuda_status(launch(kernel, element_shape(total, kThreads), stream, std::forward<Args>(args)...));
}

template <class D>
__global__ void workspace_to_kernel(const float* __restrict__ in, D* __restrict__ out, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    out[e] = from_acc<D>(in[e]);
  }
}

// out[0, total) = the sums scatter(acc) adds into acc with atomics: acc is out itself where D is
// its own accumulation type, else a float workspace from k's scratch (16-bit atomics are slow
// and round every add), converted into out once at the end. acc is zeroed first.
template <class D, class Scatter>
Status scatter_add(const KernelCall& k, Stream stream, D* out, int64_t total, const Scatter& scatter) {
  using A = acc<D>;
  if (total == 0) return Status::Ok();
  const size_t bytes = sizeof(A) * static_cast<size_t>(total);
  A* acc_buf = std::is_same_v<A, D> ? reinterpret_cast<A*>(out) : static_cast<A*>(k.scratch(bytes));
  OPBRIDGE_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(acc_buf, 0, bytes, stream.get()), "cudaMemsetAsync"));
  OPBRIDGE_RETURN_IF_ERROR(scatter(acc_buf));
  if constexpr (!std::is_same_v<A, D>) {
    return cuda_status(launch(workspace_to_kernel<D>, element_shape(total), stream, static_cast<const float*>(acc_buf),
                              out, total));
  }
  return Status::Ok();
}

}  // namespace opbridge::cuda
