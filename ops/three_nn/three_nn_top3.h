// The running best three of ThreeNN's scan, one source point at a time in increasing index order:
// shared by the CPU kernel's scan and the CUDA kernel, so that both rank alike by (distance, index).
// Slots start empty (index -1, distance +inf); a NaN distance counts as +inf (it fills an empty
// slot, after every point with a distance); an equal distance never displaces an earlier index.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define OPBRIDGE_TOP3_HD __host__ __device__ __forceinline__
#else
#define OPBRIDGE_TOP3_HD inline
#endif

namespace opbridge::point_cloud {

template <class C>
struct Top3 {
  C d0, d1, d2;  // squared distances, ascending
  int64_t i0 = -1, i1 = -1, i2 = -1;

  OPBRIDGE_TOP3_HD explicit Top3(C inf) : d0(inf), d1(inf), d2(inf) {}

  // Point k at squared distance v.
  OPBRIDGE_TOP3_HD void offer(C v, int64_t k) {
    if (!(v < d2) && i2 >= 0) return;  // the common case once three points are in; NaN falls through
    if (v != v) {
      if (i2 >= 0) return;
      v = d2;  // +inf: the third slot is still empty
    }
    if (i0 < 0 || v < d0) {
      d2 = d1, i2 = i1, d1 = d0, i1 = i0, d0 = v, i0 = k;
    } else if (i1 < 0 || v < d1) {
      d2 = d1, i2 = i1, d1 = v, i1 = k;
    } else {
      d2 = v, i2 = k;
    }
  }
};

}  // namespace opbridge::point_cloud
