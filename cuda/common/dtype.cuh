// opbridge CUDA: element types as the kernels see them (nvcc only).
//
// opbridge's 16-bit storage types (opbridge/dtype.h) are bit-compatible with CUDA's, so
// launchers reinterpret the adapters' pointers as CUDA types. Arithmetic happens in the
// accumulation type: float for float, half and bfloat16, double for double.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "opbridge/dtype.h"

namespace opbridge::cuda {

template <class T> struct DeviceType { using type = T; };
template <> struct DeviceType<Half> { using type = __half; };
template <> struct DeviceType<BFloat16> { using type = __nv_bfloat16; };
static_assert(sizeof(Half) == sizeof(__half) && sizeof(BFloat16) == sizeof(__nv_bfloat16));

template <class D> struct AccType { using type = float; };
template <> struct AccType<double> { using type = double; };
template <class D> using acc = typename AccType<D>::type;

// Host-device where the conversion exists on both sides (the host emulation tests in
// tests/cuda_ops/cuda_host/ run the kernels' index math with float and double).
__host__ __device__ __forceinline__ float to_acc(float v) { return v; }
__host__ __device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class D> __device__ __forceinline__ D from_acc(acc<D> v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_acc<double>(double v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// N elements moved as one load/store (N * sizeof(D) <= 16 bytes: one access of that width).
template <class D, int N>
struct alignas(sizeof(D) * N) Pack {
  D v[N];
};

inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace opbridge::cuda
