// opbridge CUDA: explicitly rounded arithmetic (nvcc only). nvcc fuses a multiply and an add into
// one FMA by default; where a result must equal the CPU kernel's (which never fuses), each step is
// rounded on its own.
#pragma once

namespace opbridge::cuda {

__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// (dx * dx + dy * dy) + dz * dz, rounded as the CPU kernels round it (opbridge/point_cloud.h).
template <class C>
__device__ __forceinline__ C squared_distance_rn(C dx, C dy, C dz) {
  return add_rn(add_rn(mul_rn(dx, dx), mul_rn(dy, dy)), mul_rn(dz, dz));
}

}  // namespace opbridge::cuda
