// What the point-cloud ops' CPU kernels share (ball_query, knn, three_nn, three_interpolate,
// furthest_point_sample): squared distances that round alike on every instruction set and device,
// so that every variant picks the same points, and a structure-of-arrays copy of the clouds, so
// that the distances of a block of points are one vectorizable loop.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "opbridge/dtype.h"
#include "opbridge/parallel.h"

// Distances must round alike on every device and instruction set: no fused multiply-adds. A file
// that computes them puts its code between OPBRIDGE_NO_FP_CONTRACT_BEGIN and _END (GCC applies
// the option per function, so the helpers below sit inside such a region too and inline into
// their callers).
#if defined(__clang__)
#define OPBRIDGE_NO_FP_CONTRACT_BEGIN _Pragma("clang fp contract(off)")
#define OPBRIDGE_NO_FP_CONTRACT_END
#elif defined(__GNUC__)
#define OPBRIDGE_NO_FP_CONTRACT_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"fp-contract=off\")")
#define OPBRIDGE_NO_FP_CONTRACT_END _Pragma("GCC pop_options")
#else
#define OPBRIDGE_NO_FP_CONTRACT_BEGIN
#define OPBRIDGE_NO_FP_CONTRACT_END
#endif

OPBRIDGE_NO_FP_CONTRACT_BEGIN
namespace opbridge::point_cloud {

// The type distances are computed in for coordinates of type T: double for double, else float.
template <class T>
using dist_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Points a distance loop works on at a time: their distances (2 KiB in float) stay in L1 between
// the vectorized computation and the scan that follows it.
inline constexpr int64_t kBlock = 512;

// The parallel grain of a loop over query points that each scan n points: ~32K distances a chunk.
inline int64_t query_grain(int64_t n) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, n)); }

// (dx * dx + dy * dy) + dz * dz, in this order, unfused (the CUDA kernels round each step alike).
template <class C>
inline C squared_distance(C dx, C dy, C dz) {
  return (dx * dx + dy * dy) + dz * dz;
}

// clouds [B, N, 3] -> [B][3][N] (each batch's x row, y row, z row) in C.
template <class C, class T>
std::vector<C> structure_of_arrays(const T* clouds, int64_t B, int64_t N, const ParallelFor& pf) {
  std::vector<C> soa(static_cast<size_t>(3 * B * N));
  pf(B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      C* x = soa.data() + 3 * b * N;
      for (int64_t i = 0; i < N; ++i) {
        const T* q = clouds + (b * N + i) * 3;
        x[i] = to_float(q[0]), x[N + i] = to_float(q[1]), x[2 * N + i] = to_float(q[2]);
      }
    }
  });
  return soa;
}

// d[j] = the squared distance of point i0 + j of one batch's structure-of-arrays cloud (x: its x
// row; y and z rows follow at strides of n) to (cx, cy, cz), for j < len (len <= kBlock).
template <class C>
inline void block_distances(const C* __restrict x, int64_t n, int64_t i0, int64_t len, C cx, C cy, C cz,
                            C* __restrict d) {
  const C* __restrict sx = x + i0;
  const C* __restrict sy = x + n + i0;
  const C* __restrict sz = x + 2 * n + i0;
  for (int64_t j = 0; j < len; ++j) d[j] = squared_distance(sx[j] - cx, sy[j] - cy, sz[j] - cz);
}

}  // namespace opbridge::point_cloud
OPBRIDGE_NO_FP_CONTRACT_END
